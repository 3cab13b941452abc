// Package fusefs serves an overlay.Engine through go-fuse. It is thin: each
// node method is one engine call, one errno translation (toErrno, which
// unwraps wrapped errors so the kernel never sees ENOSYS for them) and the
// reply. It owns what only the FUSE side knows: inode objects, kernel cache
// timeouts and cache invalidation after commit and discard, and, in
// watch.go, the inotify watches on the workspace that let the kernel cache
// names, attributes and listings for a minute while edits made outside the
// mount still show at once.
//
// Where the kernel allows it (root, Linux 6.9+), opens of pending bodies
// are FUSE passthrough: the kernel reads and writes the upper file itself.
// Handles on workspace files never are: a passthrough backing file would
// let a later write-open of the same inode bypass the daemon and write into
// the workspace. passthrough.go holds the rules that keep the kernel's one mode
// and one backing file per inode consistent.
package fusefs

// Package fusefs serves an overlay.Engine through go-fuse. It is thin: each
// node method is one engine call, one errno translation (toErrno, which
// unwraps wrapped errors so the kernel never sees ENOSYS for them) and the
// reply. It owns what only the FUSE side knows: inode objects, kernel cache
// timeouts and cache invalidation after commit and discard.
//
// Handles on workspace files are never passthrough-capable: a passthrough
// backing file would let a later write-open of the same inode bypass the
// daemon and write into the workspace.
package fusefs

// Package fuseuring carries FUSE requests over io_uring (Linux 6.14 and
// later) instead of read(2) and write(2) on /dev/fuse.
//
// The kernel keeps one request queue per possible CPU and hands a request
// to the queue of the CPU its caller runs on. A daemon serves a queue by
// registering ring entries with it: each entry is a header buffer and a
// payload buffer, registered by an IORING_OP_URING_CMD submission
// (FUSE_IO_URING_CMD_REGISTER) that completes when the kernel has copied a
// request into the buffers. The daemon answers in the same buffers and
// submits FUSE_IO_URING_CMD_COMMIT_AND_FETCH, which hands the answer over
// and waits for the entry's next request: one system call per request
// where /dev/fuse takes two, and no thundering herd of readers.
//
// Here every entry has a thread of its own (LockOSThread) with an
// io_uring of its own, set up single-issuer with deferred task work, so
// the kernel copies requests in only when that thread asks for them and
// never interrupts any other. A request is answered on the entry's thread,
// as go-fuse's /dev/fuse readers answer theirs; an entry busy with a slow
// request holds up only itself, as a busy reader does.
//
// The package knows nothing of the FUSE operations: a Handler turns the
// bytes of a request into the bytes of its answer (go-fuse's
// ProtocolServer.HandleRequest has this shape). FORGET, INTERRUPT and the
// daemon's notifications still travel over /dev/fuse, as the kernel sends
// them there; the /dev/fuse loop keeps running beside the rings.
//
// Turning it on: the kernel offers FUSE_OVER_IO_URING in FUSE_INIT only
// while /sys/module/fuse/parameters/enable_uring is set. A daemon that
// negotiates it must register an entry on every queue before the kernel
// sends it any request but INIT: until then every request of the mount
// waits, its unmount included. The kernel falls back to /dev/fuse for
// good when a registration fails inside FUSE. So the rings are set up
// before the mount (Prepare) and registered right after INIT (Start),
// which can no longer fail for want of descriptors or memory: Prepare
// has reserved what it needs. When a queue is left without an entry,
// Start makes a registration fail on purpose (for a queue that does not
// exist) so that the kernel falls back. Once the rings serve there is no
// falling back, so an entry the kernel refuses registers again rather
// than leave its queue one short.
//
// The entries submit on their own copy of the /dev/fuse descriptor:
// go-fuse closes its own when the connection ends, possibly while an
// entry is still answering.
package fuseuring

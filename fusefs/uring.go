package fusefs

import (
	"fmt"
	"os"
	"reflect"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"

	"stagefs/fuseuring"
)

// FUSE over io_uring (package fuseuring). The rings answer requests with
// go-fuse's own request handling: the transport-free ProtocolServer that
// go-fuse's Server embeds as its first field (go-fuse's virtiofs server
// uses the same handling on its own). go-fuse does not hand out its
// Server's, so it is taken by position: a ProtocolServer is nothing but
// that field, which ringHandler checks before it trusts it. A go-fuse
// that changes the layout gets the /dev/fuse transport and a note.

// serverLayoutOK says whether go-fuse's Server starts with the
// ProtocolServer that ringHandler takes it for.
func serverLayoutOK() error {
	st, pt := reflect.TypeOf(fuse.Server{}), reflect.TypeOf(fuse.ProtocolServer{})
	if st.NumField() == 0 || pt.NumField() != 1 {
		return fmt.Errorf("go-fuse's Server has an unknown layout")
	}
	inner := st.Field(0)
	if !inner.Anonymous || inner.Offset != 0 || inner.Type != pt.Field(0).Type {
		return fmt.Errorf("go-fuse's Server does not start with its ProtocolServer")
	}
	return nil
}

// ringHandler returns server's request handling as a fuseuring.Handler;
// prepareRing checked serverLayoutOK before the mount.
func ringHandler(server *fuse.Server) fuseuring.Handler {
	ps := (*fuse.ProtocolServer)(unsafe.Pointer(server))
	return func(in, out [][]byte) (int, syscall.Errno) {
		n, status := ps.HandleRequest(in, out)
		return n, syscall.Errno(status)
	}
}

// prepareRing sets up the rings before the mount, turning the kernel's
// offer on, and asks for io_uring in FUSE_INIT; it says why not instead
// when it cannot.
func prepareRing(mo *fuse.MountOptions, perQueue int, logf func(string, ...any)) (*fuseuring.Transport, string) {
	if os.Geteuid() != 0 {
		return nil, "needs root (the daemon mounts /dev/fuse itself)"
	}
	if err := serverLayoutOK(); err != nil {
		return nil, err.Error()
	}
	turnedOn, err := fuseuring.Enable()
	if err != nil {
		return nil, err.Error()
	}
	if turnedOn {
		logf("turned on the kernel's FUSE over io_uring for every FUSE daemon of this machine (/sys/module/fuse/parameters/enable_uring; --fuse-transport dev does not)")
	}
	ring, err := fuseuring.Prepare(fuseuring.Options{PerQueue: perQueue, MaxWrite: mo.MaxWrite, Logf: logf})
	if err != nil {
		return nil, err.Error()
	}
	mo.ExtraCapabilities |= fuse.CAP_OVER_IO_URING
	return ring, ""
}

// startRing registers the rings once FUSE_INIT is answered, if the kernel
// offered io_uring in it; otherwise they go and /dev/fuse serves alone.
func (sys *FS) startRing(ring *fuseuring.Transport, fd int) string {
	if sys.server.KernelSettings().Flags64()&fuse.CAP_OVER_IO_URING == 0 {
		ring.Abandon()
		return fuseuring.ErrNotOffered.Error()
	}
	// Kept even when a registration was refused: the entries the
	// kernel took stay until the connection ends, and unmount waits
	// for them.
	sys.ring = ring
	if err := ring.Start(fd, ringHandler(sys.server)); err != nil {
		return err.Error()
	}
	return ""
}

// Transport names the way the kernel's requests reach the daemon, and for
// io_uring how many it has answered so far.
func (sys *FS) Transport() string {
	if sys.ringNote != "" {
		return "/dev/fuse (io_uring: " + sys.ringNote + ")"
	}
	if sys.ring == nil {
		return "/dev/fuse"
	}
	return fmt.Sprintf("io_uring, %d entries (%d requests answered), with /dev/fuse for FORGET, INTERRUPT and notifications", sys.ring.Entries(), sys.ring.Served())
}

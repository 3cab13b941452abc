package fuseuring

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// A real FUSE connection served over the rings: go-fuse's in-memory file
// system, mounted on a /dev/fuse descriptor the test opens itself (as the
// stagefs daemon does as root), so the rings can be handed that
// descriptor.

func requireRings(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the test mounts /dev/fuse itself")
	}
	if _, err := os.Stat(enableParameter); err != nil {
		t.Skip("this kernel has no FUSE over io_uring")
	}
	if _, err := Enable(); err != nil {
		t.Skip(err)
	}
}

// mountOverRings mounts an empty file system at a new directory with
// io_uring negotiated, starts the rings and returns the mount point, the
// rings, what Start said, and a function that unmounts and waits for
// everything.
func mountOverRings(t *testing.T, beforeStart ...func()) (string, *Transport, error, func()) {
	t.Helper()
	mo := fuse.MountOptions{Name: "fuseuringtest", FsName: "fuseuringtest", MaxWrite: 128 << 10, ExtraCapabilities: fuse.CAP_OVER_IO_URING}
	rings, err := Prepare(Options{PerQueue: 2, MaxWrite: mo.MaxWrite, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	os.Mkdir(mnt, 0o755)
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		rings.Abandon()
		t.Fatal(err)
	}
	if err := syscall.Mount("fuseuringtest", mnt, "fuse.fuseuringtest", syscall.MS_NOSUID|syscall.MS_NODEV,
		fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,max_read=%d", fd, mo.MaxWrite)); err != nil {
		syscall.Close(fd)
		rings.Abandon()
		t.Fatal(err)
	}
	root := &fs.Inode{}
	raw := fs.NewNodeFS(root, &fs.Options{MountOptions: mo})
	server, err := fuse.NewServer(raw, fmt.Sprintf("/dev/fd/%d", fd), &mo)
	if err != nil {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		rings.Abandon()
		t.Fatal(err)
	}
	go server.Serve()
	if server.KernelSettings().Flags64()&fuse.CAP_OVER_IO_URING == 0 {
		rings.Abandon()
		syscall.Unmount(mnt, 0)
		t.Skip("the kernel did not offer io_uring in FUSE_INIT")
	}
	// go-fuse's transport-free handling inside its Server (see
	// fusefs/uring.go, which checks the layout before it trusts it).
	if reflect.TypeOf(fuse.Server{}).Field(0).Type != reflect.TypeOf(fuse.ProtocolServer{}).Field(0).Type {
		t.Fatal("go-fuse's Server layout changed")
	}
	ps := (*fuse.ProtocolServer)(unsafe.Pointer(server))
	for _, f := range beforeStart {
		f()
	}
	startErr := rings.Start(fd, func(in, out [][]byte) (int, syscall.Errno) {
		n, st := ps.HandleRequest(in, out)
		return n, syscall.Errno(st)
	})
	return mnt, rings, startErr, func() {
		done := make(chan error, 1)
		go func() {
			err := syscall.Unmount(mnt, 0)
			server.Wait()
			rings.Wait()
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("unmount: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("unmount did not finish in 10 s (a queue without an entry holds every request)")
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}
}

// works checks that the mount answers a listing and a lookup.
func works(t *testing.T, mnt string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		// The root of go-fuse's bare Inode accepts no creates: a
		// lookup and a listing are what it answers.
		_, err := os.ReadDir(mnt)
		if err == nil {
			_, err = os.Stat(filepath.Join(mnt, "missing"))
			if errors.Is(err, os.ErrNotExist) {
				err = nil
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the mount does not answer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the mount did not answer in 10 s: its requests are held")
	}
}

func TestRingsServeARealMount(t *testing.T) {
	requireRings(t)
	mnt, rings, err, unmount := mountOverRings(t)
	defer unmount()
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	works(t, mnt)
	if rings.Served() == 0 {
		t.Errorf("the rings answered no request")
	}
}

// An entry that fails before it can even submit its registration (here
// those of queue 1) would leave its queue empty and the kernel holding
// every request; Start makes the kernel fall back to /dev/fuse instead.
func TestRingsFallBackWhenAQueueGetsNoEntry(t *testing.T) {
	requireRings(t)
	if _, err := os.Stat("/sys/devices/system/cpu/cpu1"); err != nil {
		t.Skip("one CPU: no second queue to starve")
	}
	beforeRegister = func(e *entry) error {
		if e.queue == 1 {
			return errors.New("a fault made by the test")
		}
		return nil
	}
	defer func() { beforeRegister = nil }()
	mnt, _, err, unmount := mountOverRings(t)
	defer unmount()
	if err == nil || !strings.Contains(err.Error(), "a fault made by the test") {
		t.Fatalf("Start: %v, want the entry's failure", err)
	}
	works(t, mnt)
}

// A registration the kernel refuses (a payload buffer shorter than its
// max_payload_sz): the kernel falls back by itself, and Start says so.
func TestRingsFallBackWhenTheKernelRefusesAnEntry(t *testing.T) {
	requireRings(t)
	beforeRegister = func(e *entry) error {
		iov := unsafeIovecs(e)
		iov[1].Len = 4096
		return nil
	}
	defer func() { beforeRegister = nil }()
	mnt, _, err, unmount := mountOverRings(t)
	defer unmount()
	if err == nil || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Start: %v, want EINVAL from the kernel", err)
	}
	works(t, mnt)
}

func unsafeIovecs(e *entry) []syscall.Iovec {
	return unsafe.Slice((*syscall.Iovec)(unsafe.Pointer(&e.mem[iovecsAt])), 2)
}

// One entry refused while its queue has others: the rings serve, and
// Start does not make the kernel fall back for nothing.
func TestRingsServeWhenOneEntryOfAQueueFails(t *testing.T) {
	requireRings(t)
	var failed atomic.Bool // the entries register at once
	beforeRegister = func(e *entry) error {
		if e.queue == 0 && failed.CompareAndSwap(false, true) {
			return errors.New("a fault made by the test")
		}
		return nil
	}
	defer func() { beforeRegister = nil }()
	mnt, rings, err, unmount := mountOverRings(t)
	defer unmount()
	if err != nil {
		t.Fatalf("Start: %v, want the rings serving", err)
	}
	works(t, mnt)
	if rings.Served() == 0 {
		t.Errorf("the rings answered no request")
	}
}

// With no descriptor left to open, Start still gets its copy of the
// connection's (on the number Prepare reserved) and the rings serve.
func TestRingsStartWithNoDescriptorLeft(t *testing.T) {
	requireRings(t)
	var filler []int
	defer func() {
		for _, fd := range filler {
			syscall.Close(fd)
		}
	}()
	exhaust := func() {
		for {
			fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			if err != nil {
				if !errors.Is(err, syscall.EMFILE) {
					t.Fatalf("filling the descriptor table: %v", err)
				}
				return
			}
			filler = append(filler, fd)
		}
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if lim.Cur > 1<<16 {
		t.Skipf("a descriptor limit of %d is too many to fill", lim.Cur)
	}
	mnt, rings, err, unmount := mountOverRings(t, exhaust)
	for _, fd := range filler {
		syscall.Close(fd)
	}
	filler = nil
	defer unmount()
	if err != nil {
		t.Fatalf("Start with no descriptor left: %v", err)
	}
	works(t, mnt)
	if rings.Served() == 0 {
		t.Errorf("the rings answered no request")
	}
}

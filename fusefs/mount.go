package fusefs

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Mounting. As root the daemon mounts on a /dev/fuse descriptor it opens
// itself, the way go-fuse's direct mount does, and hands go-fuse the
// descriptor as "/dev/fd/N". go-fuse then skips the check it makes of a
// new mount it made (its poll hack): opening and closing a file in the
// mount from the daemon itself. A SIGKILL that caught a thread in that
// close left it waiting forever for an answer its own dead daemon could
// not give: the process a zombie, the mount hung. Other users mount
// through fusermount3, and go-fuse's check stays.

// mountDevice mounts a FUSE file system at mountpoint with mo's options
// and returns its /dev/fuse descriptor.
func mountDevice(mountpoint string, mo *fuse.MountOptions) (int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(mountpoint, &st); err != nil {
		return -1, err
	}
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	// Only options the kernel itself knows: these, as fusermount passes
	// them, then mo's.
	opts := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", st.Mode&syscall.S_IFMT),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
	}
	opts = append(opts, mo.Options...)
	if mo.AllowOther {
		opts = append(opts, "allow_other")
	}
	if err := syscall.Mount(mo.FsName, mountpoint, "fuse."+mo.Name, syscall.MS_NOSUID|syscall.MS_NODEV, strings.Join(opts, ",")); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Unmount unmounts the file system unless a process holds it (EBUSY,
// after a few tries: the kernel may not have seen the last closes yet)
// and returns once the daemon has stopped serving it.
func (sys *FS) Unmount() error {
	if !sys.ownMount {
		err := sys.server.Unmount()
		sys.waitRing()
		return err
	}
	var err error
	delay := time.Duration(0)
	for try := 0; try < 5; try++ {
		if err = syscall.Unmount(sys.mountpoint, 0); err == nil || err == syscall.EINVAL {
			break // EINVAL: not mounted (any more)
		}
		delay = 2*delay + 5*time.Millisecond
		time.Sleep(delay)
	}
	if err != nil && err != syscall.EINVAL {
		return err
	}
	sys.Wait()
	return nil
}

// Wait returns once the daemon has stopped serving the file system: it
// was unmounted, here or from outside.
func (sys *FS) Wait() {
	sys.server.Wait()
	sys.waitRing()
}

// waitRing returns once the io_uring entries have stopped: the kernel
// ends them when the connection ends.
func (sys *FS) waitRing() {
	if sys.ring != nil {
		sys.ring.Wait()
	}
}

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// keptCapabilities are the capabilities a root command keeps: those a
// container runtime's default profile gives (Docker's) but CAP_MKNOD, which
// let root own and chown files, change its ids and bind low ports, and none
// that reach past the file tree it is given. (Docker keeps CAP_MKNOD behind
// a device cgroup; without one, root could make a node for the disk that
// holds the workspace and write it raw.) Gone are CAP_SYS_ADMIN (mount, umount,
// pivot_root, setns), CAP_SYS_PTRACE, CAP_SYS_MODULE, CAP_SYS_RAWIO,
// CAP_DAC_READ_SEARCH (open_by_handle_at reaches any file of a mounted
// file system, the workspace's included) and the rest.
var keptCapabilities = []uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_KILL, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP,
	unix.CAP_NET_BIND_SERVICE, unix.CAP_NET_RAW, unix.CAP_SYS_CHROOT,
	unix.CAP_AUDIT_WRITE, unix.CAP_SETFCAP,
}

// dropCapabilities leaves this thread, and the command it forks next, only
// keptCapabilities in every set (bounding, permitted, effective,
// inheritable; the ambient set empty), and sets no_new_privs so no exec
// can gain more. The caller holds the thread (runtime.LockOSThread).
//
// The bounding set can only shrink with CAP_SETPCAP, which init has (see
// ways). A command that is not uid 0 in its namespace starts with no
// capabilities at all once the ambient set is cleared.
func dropCapabilities() error {
	keep := uint64(0)
	for _, c := range keptCapabilities {
		keep |= 1 << c
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read the capabilities: %v", err)
	}
	last, err := lastCapability()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %v", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		// EINVAL: a kernel without ambient capabilities, which then gave
		// none.
		return fmt.Errorf("clear the ambient capabilities: %v", err)
	}
	for i := range data {
		k := uint32(keep >> (32 * i))
		data[i].Effective &= k
		data[i].Permitted &= k
		data[i].Inheritable = 0
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop the capabilities: %v", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %v", err)
	}
	return nil
}

// lastCapability is the highest capability number this kernel knows.
func lastCapability() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read the last capability: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("read the last capability: %q", b)
	}
	return n, nil
}

package sandbox

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Terminal input injection. The command shares the caller's terminal
// (an agent's TUI needs it), and the kernel lets a process push bytes
// into the input queue of its controlling terminal (ioctl TIOCSTI; on a
// virtual console TIOCLINUX can paste): the caller's shell would read and
// run them once the command ends, outside the namespace. A seccomp filter
// refuses both ioctls to the command and everything it starts (EPERM, as
// kernels built without legacy TIOCSTI answer). The filter also matches
// the 32-bit and x32 system call numbers of ioctl, so a 32-bit binary
// cannot go around it.

// seccompData offsets (struct seccomp_data): nr, arch, ip, args[6].
const (
	offNr   = 0
	offArch = 4
	offArg1 = 16 + 8 // the low half of args[1] (little endian): the request
)

// ioctlNumbers lists, per audit arch, the ioctl system call numbers to
// check on this architecture.
func ioctlNumbers() (map[uint32][]uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		const x32 = 0x40000000
		return map[uint32][]uint32{
			unix.AUDIT_ARCH_X86_64: {unix.SYS_IOCTL, x32 | 514}, // 514: x32's ioctl
			unix.AUDIT_ARCH_I386:   {54},
		}, nil
	case "arm64":
		return map[uint32][]uint32{
			unix.AUDIT_ARCH_AARCH64: {unix.SYS_IOCTL},
			unix.AUDIT_ARCH_ARM:     {54},
		}, nil
	}
	return nil, fmt.Errorf("no terminal-injection filter for %s", runtime.GOARCH)
}

// terminalFilter builds the BPF program: for an ioctl (any of the arch's
// numbers) whose request is TIOCSTI or TIOCLINUX, EPERM; else allow.
func terminalFilter() ([]unix.SockFilter, error) {
	arches, err := ioctlNumbers()
	if err != nil {
		return nil, err
	}
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jeq := func(k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k, Jt: jt, Jf: jf}
	}
	allow := stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW)
	deny := stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ERRNO|uint32(syscall.EPERM))
	// The request check, shared: load it, compare, answer.
	check := []unix.SockFilter{
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArg1),
		jeq(unix.TIOCSTI, 1, 0),
		jeq(unix.TIOCLINUX, 0, 1),
		deny,
		allow,
	}
	var prog []unix.SockFilter
	for arch, nrs := range arches {
		// arch matches: check its numbers; else skip this block.
		block := []unix.SockFilter{stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr)}
		for i, nr := range nrs {
			// Jump over the remaining comparisons and the allow to
			// the request check on a match.
			rest := len(nrs) - 1 - i
			block = append(block, jeq(nr, uint8(rest+1), 0))
		}
		block = append(block, allow)
		block = append(block, check...)
		prog = append(prog, stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch), jeq(arch, 0, uint8(len(block))))
		prog = append(prog, block...)
	}
	return append(prog, allow), nil
}

// refuseTerminalInjection installs terminalFilter on this thread, which the
// command is forked from next. It needs no_new_privs (dropCapabilities).
func refuseTerminalInjection() error {
	filter, err := terminalFilter()
	if err != nil {
		return err
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if _, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); errno != 0 {
		return fmt.Errorf("install the seccomp filter against terminal input injection: %v", errno)
	}
	return nil
}

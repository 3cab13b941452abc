package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

// exitNamespaceRefused is init's status when it could not set up the
// namespace's mounts: the parent then tries the next way (see ways).
const (
	exitNamespaceRefused = 125
	refusedPrefix        = "refused: "
)

// InitMain is the namespace's PID 1. It makes the workspace path show the
// stagefs mount, makes the rest of the file system read-only but for the
// scratch layer and the allowed paths (unless the mount says --outside
// rw), hides the state dir, mounts a /proc of the namespace's own, drops
// the capabilities, starts the command and waits for it,
// reaping every orphan meanwhile. It returns the exit status for the
// process; when it exits, the kernel ends every process left in the
// namespace.
func InitMain(args []string) int {
	// Not dumpable: /proc/1 is then root's, and reading or writing this
	// process's memory, or tracing it, needs CAP_SYS_PTRACE over its user
	// namespace, which the command never has. Without it the command
	// could take over a thread of init that still holds CAP_SYS_ADMIN (a
	// thread's capabilities are its own) and unmount the staged view.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "stagefs: %s: make init undumpable: %v\n", InitCommand, err)
		return 1
	}
	// Descriptors the caller leaked to us (without close-on-exec) must not
	// reach the command: one on the workspace would lead around the mount.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		fmt.Fprintf(os.Stderr, "stagefs: %s: close inherited descriptors: %v\n", InitCommand, err)
		return 1
	}
	// Until the command runs, failures go to the parent, which prints them
	// and tells them apart from the command's own status. The command must
	// inherit neither descriptor.
	report := os.NewFile(reportFd, "report")
	syscall.CloseOnExec(reportFd)
	syscall.CloseOnExec(signalFd)
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(report, format+"\n", a...)
		return code
	}
	// Signals from the terminal reach the command directly (it is in the
	// same process group); those meant for it arrive on signalFd. They are
	// caught and dropped, not ignored: an ignored signal would stay
	// ignored in the command.
	drop := make(chan os.Signal, 16)
	signal.Notify(drop, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	go func() {
		for range drop {
		}
	}()

	var ws, mnt, state, workdir, outerNS, outside string
	var allow, expose []string
	fs := pflag.NewFlagSet(InitCommand, pflag.ContinueOnError)
	fs.StringVar(&ws, "workspace", "", "")
	fs.StringVar(&mnt, "mount", "", "")
	fs.StringVar(&state, "state", "", "")
	fs.StringVar(&workdir, "workdir", "", "")
	fs.StringVar(&outerNS, "outer-ns", "", "")
	fs.StringVar(&outside, "outside", OutsideReadOnly, "")
	fs.StringArrayVar(&allow, "allow", nil, "")
	fs.StringArrayVar(&expose, "expose", nil, "")
	fs.SetInterspersed(false)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil || ws == "" || mnt == "" || state == "" || workdir == "" || outerNS == "" || fs.NArg() == 0 ||
		(outside != OutsideReadOnly && outside != OutsideWritable) {
		fmt.Fprintf(os.Stderr, "stagefs: %s is internal: use stagefs run\n", InitCommand)
		return 2
	}
	// Never mount over the workspace in the caller's namespace, e.g. when
	// this command is run by hand.
	if ns, err := os.Readlink("/proc/self/ns/mnt"); err != nil || ns == outerNS || os.Getpid() != 1 {
		fmt.Fprintf(os.Stderr, "stagefs: %s must run as PID 1 of new namespaces: use stagefs run\n", InitCommand)
		return 1
	}

	var conf *confinement
	if outside == OutsideReadOnly {
		conf = &confinement{ws: ws, mnt: mnt, state: state, allow: allow, expose: expose,
			home: os.Getenv("HOME"), tmpdir: os.Getenv("TMPDIR"), warn: warnf(os.Stderr)}
	}
	if err := setupMounts(ws, mnt, state, conf); err != nil {
		return fail(exitNamespaceRefused, "%s%v", refusedPrefix, err)
	}
	if err := os.Chdir(workdir); err != nil {
		return fail(exitSetup, "working directory: %v", err)
	}
	argv := fs.Args()
	path, err := exec.LookPath(argv[0])
	if err != nil && !errors.Is(err, exec.ErrDot) {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return fail(ExitNotFound, "%s: command not found", argv[0])
		}
		return fail(ExitCannotExec, "%s: %v", argv[0], err)
	}
	cmd := &exec.Cmd{
		Path:   path,
		Args:   argv,
		Env:    commandEnv(workdir),
		Dir:    workdir,
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Stderr: os.Stderr,
	}
	// Capabilities, the bounding set and no_new_privs belong to a thread,
	// and the command inherits them from the thread that forks it.
	runtime.LockOSThread()
	if err := dropCapabilities(); err != nil {
		return fail(exitSetup, "%v", err)
	}
	if err := refuseTerminalInjection(); err != nil {
		return fail(exitSetup, "%v", err)
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return fail(ExitNotFound, "%s: %v", argv[0], err)
		}
		return fail(ExitCannotExec, "%s: %v", argv[0], err)
	}
	runtime.UnlockOSThread()
	report.Close()
	go forwardSignals(cmd.Process.Pid)
	return reap(cmd.Process.Pid)
}

// commandEnv is the command's environment: ours, with $PWD naming the
// working directory under the workspace (shells believe an inherited $PWD
// that names the same directory, and a path under the mount would).
func commandEnv(workdir string) []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PWD=") {
			env = append(env, e)
		}
	}
	return append(env, "PWD="+workdir)
}

// forwardSignals sends the command each signal the parent forwards. When
// the parent is gone (EOF), nobody waits for the command any more: it and
// everything it started are ended.
func forwardSignals(pid int) {
	sigs := os.NewFile(signalFd, "signals")
	buf := make([]byte, 1)
	for {
		if _, err := sigs.Read(buf); err != nil {
			syscall.Kill(-1, syscall.SIGKILL) // every process in the namespace but init
			os.Exit(128 + int(syscall.SIGKILL))
		}
		syscall.Kill(pid, syscall.Signal(buf[0]))
	}
}

// reap waits for every child, orphans included (they are reparented to
// PID 1), until the command itself ends, and returns its status.
func reap(pid int) int {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return exitSetup // ECHILD: cannot happen while the command runs
		}
		if got != pid {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

// setupMounts makes this new mount namespace show the stagefs mount at the
// workspace path, confines the rest (conf; nil for --outside rw: writable
// as outside), hides the state dir, and gives the namespace its own /proc
// with the kernel's knobs read-only.
func setupMounts(ws, mnt, state string, conf *confinement) error {
	// Nothing mounted here may propagate back to the caller's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %v%s", err, userNSHint(err))
	}
	// The places whose contents a mount replaced: a state dir under one
	// that is not found is hidden by it.
	covered := []string{ws}
	if conf != nil {
		private, err := confine(*conf)
		if err != nil {
			return err
		}
		covered = append(covered, private...)
	} else if err := unix.Mount(mnt, ws, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s over %s: %v%s", mnt, ws, err, userNSHint(err))
	}
	// Last, so it covers whatever the layout put at the state dir's path.
	if err := hideStateDir(state, covered); err != nil {
		return err
	}
	const noExec = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("proc", "/proc", "proc", noExec, ""); err != nil {
		return fmt.Errorf("mount a /proc of the namespace's own: %v%s", err, userNSHint(err))
	}
	// Root could otherwise reach past the boundary through the kernel's
	// knobs (core_pattern, uevent_helper). In a user namespace the kernel
	// refuses those writes anyway.
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/sys"} {
		if _, err := os.Stat(p); err != nil {
			continue // not on this kernel
		}
		if err := readOnly(p, p == "/sys"); err != nil {
			return err
		}
	}
	return nil
}

// hideStateDir covers a state dir outside the workspace with an empty
// read-only tmpfs, so neither it nor the control socket can be reached by
// path. One under the workspace is already hidden by the mount (ENOENT),
// as is one under another place in covered (the confinement's private
// /tmp, say) whose contents a mount replaced.
func hideStateDir(state string, covered []string) error {
	under := false
	for _, dir := range covered {
		under = under || within(state, dir)
	}
	if under {
		// What is at the path in such a place was made there by a
		// command (the place is kept between runs) unless the mount that
		// covers it failed: reached without following any symlink, a
		// link the command left (to the workspace, say) moves no tmpfs.
		fd, err := unix.Openat2(unix.AT_FDCWD, state, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_DIRECTORY,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			return nil // hidden by that mount, or a link: the state dir is not there
		case err != nil:
			return fmt.Errorf("state dir %s: %v", state, err)
		}
		defer unix.Close(fd)
		return hideAt(state, fmt.Sprintf("/proc/self/fd/%d", fd))
	}
	st, err := os.Lstat(state)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Fail closed: a state dir not found is not known to be hidden.
		return fmt.Errorf("state dir %s: not found, so it cannot be hidden", state)
	case err != nil:
		return fmt.Errorf("state dir %s: %v", state, err)
	case !st.IsDir():
		return fmt.Errorf("state dir %s is not a directory here", state)
	}
	return hideAt(state, state)
}

// hideAt mounts the empty read-only tmpfs over the state dir state, named
// at for the mount (a path, or its descriptor's /proc/self/fd link).
func hideAt(state, at string) error {
	if err := unix.Mount("stagefs-hidden", at, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555"); err != nil {
		return fmt.Errorf("hide the state dir %s: %v%s", state, err, userNSHint(err))
	}
	return nil
}

// readOnly makes the tree at p read-only in this namespace: a bind of p
// onto itself remounted read-only, or with recursive set, every mount at
// and below p.
func readOnly(p string, recursive bool) error {
	if recursive {
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(unix.AT_FDCWD, p, unix.AT_RECURSIVE, attr); err != nil {
			return fmt.Errorf("make %s read-only: %v", p, err)
		}
		return nil
	}
	if err := unix.Mount(p, p, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %v", p, err)
	}
	if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make %s read-only: %v", p, err)
	}
	return nil
}

// userNSHint explains an EPERM inside an unprivileged user namespace, where
// some kernels (AppArmor, SELinux) allow the namespace but not mounts.
func userNSHint(err error) string {
	if !errors.Is(err, syscall.EPERM) || os.Getuid() == 0 {
		return ""
	}
	if appArmorRestrictsUserNS() {
		return " (" + appArmorAdvice + ")"
	}
	return " (this kernel lets unprivileged users create user namespaces but not mount in them, e.g. kernel.apparmor_restrict_unprivileged_userns=1 or an SELinux policy; run as root or allow it)"
}

// appArmorAdvice is what to do where AppArmor keeps unprivileged user
// namespaces from mounting (Ubuntu 23.10 and later).
const appArmorAdvice = "AppArmor restricts unprivileged user namespaces on this machine (sysctl kernel.apparmor_restrict_unprivileged_userns=1): " +
	"allow them with `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (a file in /etc/sysctl.d keeps it), " +
	"or load an AppArmor profile for the stagefs binary that has the `userns,` rule; or run as root. " +
	"stagefs runs nothing without its sandbox"

// appArmorRestrictsUserNS reports whether AppArmor's restriction of
// unprivileged user namespaces is on.
func appArmorRestrictsUserNS() bool {
	b, err := os.ReadFile("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

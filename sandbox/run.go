package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// InitCommand is the hidden subcommand of the stagefs binary that runs as
// the namespace's PID 1 (see InitMain).
const InitCommand = "__run-child"

// The descriptors the parent hands to the init process.
const (
	// reportFd carries a failure before the command starts. Init closes it
	// once the command runs, so the parent reads EOF with no data.
	reportFd = 3
	// signalFd carries signals to forward to the command, one byte each.
	// Its EOF means the parent is gone: init then ends the namespace.
	signalFd = 4
)

// Exit statuses for a command that could not be started, as shells use them.
const (
	ExitCannotExec = 126
	ExitNotFound   = 127
	exitSetup      = 1
)

// Spec is one command to run in the sandbox.
type Spec struct {
	Workspace string   // the real workspace; shows the staged view inside
	Mount     string   // the stagefs mount point serving it
	State     string   // the daemon's state dir, hidden inside
	Workdir   string   // the working directory, a path under Workspace
	Argv      []string // the command
	Env       []string // added to the caller's environment
	// Expose lists the caller's own paths that the command must reach,
	// read-write, at their paths, even where the sandbox puts a private
	// place around them (the agent commands' settings layer, made in the
	// host's /tmp).
	Expose []string
	// The command's standard streams; nil: the caller's own.
	Stdin, Stdout, Stderr *os.File
	// Forward decides whether a signal the caller received goes on to the
	// command (nil: always).
	Forward func(os.Signal) bool
	// Signals carries signals the caller sends the command itself.
	Signals <-chan os.Signal
}

// Result is how the command ended.
type Result struct {
	Code    int    // its exit status, 128+N if signal N ended it
	Started bool   // false: the namespace was made but the command did not start
	Error   string // why it did not start
}

// Run runs spec.Argv in a new sandbox with the caller's standard streams
// and waits for it. An error means no namespace could be made at all; a
// command that could not start (not found, a mount that failed inside) is
// a Result with Started false, its message on stderr, and status 127, 126
// or 1.
//
// What the command may write outside the workspace is the mount's choice,
// recorded by its daemon in the state dir (Settings).
func Run(spec Spec) (Result, error) {
	outerNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return Result{}, fmt.Errorf("read this process's mount namespace: %w", err)
	}
	set, err := LoadSettings(spec.State)
	if err != nil {
		return Result{}, err
	}
	args := []string{InitCommand, "--workspace", spec.Workspace, "--mount", spec.Mount, "--state", spec.State,
		"--workdir", spec.Workdir, "--outer-ns", outerNS, "--outside", set.Outside}
	for _, p := range set.Allow {
		args = append(args, "--allow", p)
	}
	for _, p := range spec.Expose {
		args = append(args, "--expose", p)
	}
	args = append(args, "--")
	args = append(args, spec.Argv...)

	var refusals []string // why each way of making the namespace failed
	for _, w := range ways() {
		res, err := start(args, append(os.Environ(), spec.Env...), spec.streams(), w, spec.Forward, spec.Signals)
		var refused *refusal
		if errors.As(err, &refused) {
			refusals = append(refusals, refused.msg)
			continue
		}
		return res, err
	}
	hint := ""
	if os.Geteuid() != 0 && appArmorRestrictsUserNS() {
		hint = "; " + appArmorAdvice
	}
	return Result{}, fmt.Errorf("cannot create a private mount namespace (%s): stagefs run needs root, or user namespaces that this user may create (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, a seccomp profile that allows them)%s",
		strings.Join(refusals, "; "), hint)
}

// streams are the command's standard streams.
func (spec Spec) streams() [3]*os.File {
	out := [3]*os.File{os.Stdin, os.Stdout, os.Stderr}
	for i, f := range []*os.File{spec.Stdin, spec.Stdout, spec.Stderr} {
		if f != nil {
			out[i] = f
		}
	}
	return out
}

// refusal is a way of making the namespace that the kernel refused; the
// next one is tried.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

// start makes the namespace one way and runs init in it.
func start(args, env []string, stdio [3]*os.File, w way, forward func(os.Signal) bool, own <-chan os.Signal) (Result, error) {
	reportR, reportW, err := os.Pipe()
	if err != nil {
		return Result{}, err
	}
	defer reportR.Close()
	sigR, sigW, err := os.Pipe()
	if err != nil {
		reportW.Close()
		return Result{}, err
	}
	defer sigW.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        append([]string{"stagefs"}, args...),
		Dir:         "/", // init holds nothing of the real workspace
		Env:         env,
		Stdin:       stdio[0],
		Stdout:      stdio[1],
		Stderr:      stdio[2],
		ExtraFiles:  []*os.File{reportW, sigR}, // fds 3 and 4
		SysProcAttr: w.attr,
	}
	// Before Start, so a signal arriving at once is not lost.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	err = cmd.Start()
	reportW.Close()
	sigR.Close()
	if err != nil {
		if refused(err) {
			return Result{}, &refusal{w.refusal(err)}
		}
		return Result{}, fmt.Errorf("start %s: %w", InitCommand, err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case s := <-sigs:
				if forward == nil || forward(s) {
					sigW.Write([]byte{byte(s.(syscall.Signal))})
				}
			case s := <-own:
				sigW.Write([]byte{byte(s.(syscall.Signal))})
			case <-done:
				return
			}
		}
	}()
	// EOF with nothing read: the command started. A message: init failed
	// before that.
	report, _ := io.ReadAll(reportR)
	code, err := waitStatus(cmd.Wait())
	if err != nil {
		return Result{}, err
	}
	msg := strings.TrimSpace(string(report))
	if msg == "" {
		return Result{Code: code, Started: true}, nil
	}
	if code == exitNamespaceRefused {
		return Result{}, &refusal{w.name + ": " + strings.TrimPrefix(msg, refusedPrefix)}
	}
	fmt.Fprintf(os.Stderr, "stagefs run: %s\n", msg)
	if code == 0 {
		code = exitSetup
	}
	return Result{Code: code, Error: msg}, nil
}

// waitStatus turns cmd.Wait's error into an exit status, 128+N for a
// signal.
func waitStatus(err error) (int, error) {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0, err
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ws.ExitStatus(), nil
}

// way is one way of making the sandbox's namespaces.
type way struct {
	name string
	attr *syscall.SysProcAttr
}

// ways lists the ways to make the namespaces, strongest first.
//
// A user namespace comes first, for root as for everyone: inside it the
// capabilities the command keeps mean nothing outside, and the kernel
// locks every mount the namespace inherits. Root maps every uid to itself,
// so files keep their owners and chown works; another user maps only
// their own uid. As root, a plain mount and PID namespace is the fallback
// where user namespaces are off: the command then loses its capabilities
// in every set all the same.
//
// A user that is not root would lose the namespace's capabilities at the
// exec of init, which must mount and shrink the bounding set:
// CAP_SYS_ADMIN and CAP_SETPCAP are kept across that exec as ambient
// capabilities, and init drops them before it starts the command. So are
// CAP_DAC_OVERRIDE and CAP_FOWNER, which overlayfs needs of whoever mounts
// the scratch layer over $HOME: it works in its work dir (mode 000) and
// in the upper layer with the mounter's rights. In the namespace they
// reach only the user's own files, and the command never has them.
func ways() []way {
	uid, gid := os.Geteuid(), os.Getegid()
	userNS := &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		GidMappingsEnableSetgroups: false,
		AmbientCaps:                []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SETPCAP, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER},
	}
	if uid != 0 {
		return []way{{"a user namespace", userNS}}
	}
	// (uid_t)-1 is no uid, so the whole range is one short of 2^32.
	const allIDs = 1<<32 - 1
	userNS.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: allIDs}}
	userNS.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: allIDs}}
	userNS.GidMappingsEnableSetgroups = true
	userNS.AmbientCaps = nil
	return []way{
		{"a user namespace", userNS},
		{"a mount namespace", &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC}},
	}
}

// refusal says which namespace the kernel refused and, for the errors
// that name no cause (EPERM, ENOSPC), the likely one.
func (w way) refusal(err error) string {
	if w.attr.Cloneflags&syscall.CLONE_NEWUSER == 0 {
		if errors.Is(err, syscall.EPERM) {
			return fmt.Sprintf("%s: %v, no CAP_SYS_ADMIN", w.name, err)
		}
		return fmt.Sprintf("%s: %v", w.name, err)
	}
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EUSERS):
		return fmt.Sprintf("%s: %v, the limit user.max_user_namespaces is 0 or reached", w.name, err)
	case errors.Is(err, syscall.EPERM):
		return fmt.Sprintf("%s: %v, unprivileged ones are disabled, filtered by seccomp or refused in a chroot", w.name, err)
	}
	return fmt.Sprintf("%s: %v", w.name, err)
}

// refused reports whether a failed start means the kernel would not make
// the namespace (rather than, say, a lack of memory).
func refused(err error) bool {
	for _, e := range []error{syscall.EPERM, syscall.EACCES, syscall.EINVAL, syscall.ENOSPC, syscall.EUSERS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

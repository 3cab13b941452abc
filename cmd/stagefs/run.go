package main

// stagefs run: one command in a private mount namespace in which the
// workspace's own path shows the staged view.
//
// The parent (`stagefs run`) talks to the daemon, works out the paths, opens
// the tool call's snapshot and starts `stagefs __run-child` in a new mount
// namespace. The child makes its mounts private, bind-mounts the stagefs
// mount over the workspace, covers the state dir with an empty read-only
// tmpfs, changes to the working directory and execs the command, which
// keeps the child's pid: the command is the parent's direct child, so the
// snapshot bound to the parent's pid sees everything it does.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"stagefs/control"
)

// runChildCommand is the hidden subcommand that sets up the private mount
// namespace for stagefs run and then becomes the command.
const runChildCommand = "__run-child"

// childReportFd is the descriptor on which __run-child reports a failure
// before the command starts. It is close-on-exec, so the parent reads EOF
// with no data once the command has been exec'd.
const childReportFd = 3

// Exit statuses for a command that could not be started, as shells use them.
const (
	exitCannotExec = 126
	exitNotFound   = 127
)

// runResult is what `stagefs run --json` prints as the last line of stdout.
type runResult struct {
	ExitCode int    `json:"exitCode"`
	Started  bool   `json:"started"`         // false: the namespace or the exec failed
	Error    string `json:"error,omitempty"` // why it did not start
	Workdir  string `json:"workdir"`
	// With --scope (else null): the close_snapshot result and the pending
	// changes at (or below) the paths the command touched, as
	// fs/staged_status gives them.
	Snapshot *control.SnapshotInfo `json:"snapshot"`
	Changes  []control.StatusEntry `json:"changes"`
}

func runRun(ctx context.Context, args []string) error {
	const usage = "usage: stagefs run [-m MOUNTPOINT] [--scope ID] [--workdir DIR] [--json] -- CMD [ARGS...]"
	var scope, workdir string
	fs, cf := newClientFlags("run")
	fs.StringVar(&scope, "scope", "", "open a snapshot for this tool call while CMD runs and summarize what it changed")
	fs.StringVar(&workdir, "workdir", "", "working directory, inside the workspace or the mount (default: the current directory if it is inside either, else the workspace root)")
	// Flags end at CMD, so `stagefs run ls -l` works without "--".
	fs.SetInterspersed(false)
	if err := fs.Parse(args); err != nil {
		return usagef("run: %v", err)
	}
	if fs.NArg() == 0 {
		return usagef(usage)
	}
	argv := fs.Args()

	c, err := dialForRun(ctx, cf)
	if err != nil {
		return err
	}
	defer c.Close()
	init, err := c.Initialize(ctx)
	if err != nil {
		return err
	}
	ws, mnt := init.Workspace, init.Mount
	m, ok := isMounted(mnt)
	if !ok || !strings.HasPrefix(m.source, stagefsSourcePrefix) {
		return fmt.Errorf("the daemon's mount point %s is not a stagefs mount in this mount namespace", mnt)
	}
	state := strings.TrimPrefix(m.source, stagefsSourcePrefix)
	dir, err := runWorkdir(workdir, ws, mnt)
	if err != nil {
		return err
	}
	outerNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("read this process's mount namespace: %w", err)
	}

	if scope != "" {
		// Bound to our own pid: the command is our child, so it and
		// everything it starts are captured, and nothing else is.
		if _, err := c.Snapshot(ctx, control.SnapshotParams{ScopeID: scope, Pid: os.Getpid()}); err != nil {
			return err
		}
	}

	childArgs := append([]string{runChildCommand, "--workspace", ws, "--mount", mnt, "--state", state,
		"--workdir", dir, "--outer-ns", outerNS, "--"}, argv...)
	res := runResult{Workdir: dir}
	code, err := startInNamespace(childArgs, &res)
	if err != nil {
		if scope != "" {
			// Nothing ran: drop the empty snapshot rather than leave it
			// open.
			c.DropSnapshot(context.Background(), scope)
		}
		return err
	}

	if scope != "" {
		// Not ctx: a signal we forwarded may have cancelled it, and the
		// snapshot must be closed all the same. A failure here is only
		// reported: CMD's exit status is what the caller needs most.
		bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := closeRunSnapshot(bg, c, scope, &res); err != nil {
			fmt.Fprintf(os.Stderr, "stagefs run: closing the snapshot %s: %v\n", scope, err)
		} else if !cf.json {
			printRunSummary(scope, *res.Snapshot, res.Changes)
		}
	}
	res.ExitCode = code
	if cf.json {
		// CMD's output, then a newline, then one line of JSON: a host
		// recovers CMD's exact output by cutting the last line and the
		// newline before it.
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Printf("\n%s\n", b)
	}
	if code != 0 {
		return &exitStatus{code}
	}
	return nil
}

// closeRunSnapshot closes the tool call's snapshot and looks up the pending
// changes at the paths it touched.
func closeRunSnapshot(ctx context.Context, c *control.Client, scope string, res *runResult) error {
	info, err := c.CloseSnapshot(ctx, scope)
	if err != nil {
		return err
	}
	changes := []control.StatusEntry{}
	if len(info.Paths) > 0 {
		// Status with no paths means all of them; only ask for ours.
		st, err := c.Status(ctx, info.Paths)
		if err != nil {
			return err
		}
		changes = st.Entries
	}
	res.Snapshot, res.Changes = &info, changes
	return nil
}

// dialForRun finds the daemon like every client (-m, --socket,
// $STAGEFS_SOCKET, the mount holding the current directory) and, failing
// that, the daemon whose workspace holds the current directory: run is
// typically started from the workspace itself.
func dialForRun(ctx context.Context, cf *clientFlags) (*control.Client, error) {
	c, err := cf.dial()
	var nd *noDaemonError
	if err == nil || !errors.As(err, &nd) || cf.mount != "" || cf.socket != "" || os.Getenv("STAGEFS_SOCKET") != "" {
		return c, err
	}
	wd, werr := os.Getwd()
	if werr != nil {
		return nil, err
	}
	if real, rerr := filepath.EvalSymlinks(wd); rerr == nil {
		wd = real
	}
	ms, _ := readMounts()
	var best *control.Client
	bestWS := ""
	for _, m := range ms {
		if !strings.HasPrefix(m.source, stagefsSourcePrefix) {
			continue
		}
		cand, derr := control.Dial(socketPath(strings.TrimPrefix(m.source, stagefsSourcePrefix)))
		if derr != nil {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		init, ierr := cand.Initialize(ictx)
		cancel()
		if ierr != nil || !within(wd, init.Workspace) || len(init.Workspace) <= len(bestWS) {
			cand.Close()
			continue
		}
		if best != nil {
			best.Close()
		}
		best, bestWS = cand, init.Workspace
	}
	if best == nil {
		return nil, &noDaemonError{fmt.Errorf("no stagefs mount or mounted workspace holds %s: pass -m MOUNTPOINT, --socket PATH or set STAGEFS_SOCKET", wd)}
	}
	return best, nil
}

// runWorkdir picks the command's working directory as a path under the
// workspace: --workdir if given, else the current directory if it is in
// the workspace or the mount, else the workspace root.
func runWorkdir(flag, ws, mnt string) (string, error) {
	if flag != "" {
		abs, err := filepath.Abs(flag)
		if err != nil {
			return "", err
		}
		dir, ok := intoWorkspace(abs, ws, mnt)
		if !ok {
			return "", usagef("--workdir %s is outside the workspace %s and the mount %s", flag, ws, mnt)
		}
		if !isStagedDir(dir, ws, mnt) {
			return "", fmt.Errorf("--workdir %s is not a directory in the staged view", flag)
		}
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return ws, nil
	}
	dir, ok := intoWorkspace(wd, ws, mnt)
	if !ok {
		return ws, nil
	}
	if !isStagedDir(dir, ws, mnt) {
		// E.g. the directory was deleted in the staged view.
		fmt.Fprintf(os.Stderr, "stagefs: %s is not a directory in the staged view; starting %s\n", dir, ws)
		return ws, nil
	}
	return dir, nil
}

// intoWorkspace maps p, a path in the workspace or in the mount, to the
// same place under the workspace path. A path that is neither is tried
// again with its symlinks resolved.
func intoWorkspace(p, ws, mnt string) (string, bool) {
	try := func(p string) (string, bool) {
		for _, root := range []string{ws, mnt} {
			if within(p, root) {
				rel, err := filepath.Rel(root, p)
				if err != nil {
					return "", false
				}
				return filepath.Join(ws, rel), true
			}
		}
		return "", false
	}
	p = filepath.Clean(p)
	if dir, ok := try(p); ok {
		return dir, true
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return try(real)
	}
	return "", false
}

// isStagedDir reports whether dir (under ws) is a directory in the staged
// view, which outside the namespace is the mount.
func isStagedDir(dir, ws, mnt string) bool {
	rel, err := filepath.Rel(ws, dir)
	if err != nil {
		return false
	}
	st, err := os.Stat(filepath.Join(mnt, rel))
	return err == nil && st.IsDir()
}

// startInNamespace runs `stagefs ARGS...` (__run-child ...) in a new mount
// namespace, forwards signals while it runs and returns the
// command's exit status (128+N if a signal killed it). An error means no
// namespace could be made; a command that could not be started (not found,
// namespace setup failed inside) is reported on stderr and in res, with
// its status (127, 126 or 1).
func startInNamespace(args []string, res *runResult) (int, error) {
	var refusals []string // why each way of making the namespace failed
	for _, attr := range namespaceAttrs() {
		r, w, err := os.Pipe()
		if err != nil {
			return 0, err
		}
		cmd := &exec.Cmd{
			Path:        "/proc/self/exe",
			Args:        append([]string{"stagefs"}, args...),
			Dir:         "/", // the child holds nothing of the real workspace
			Stdin:       os.Stdin,
			Stdout:      os.Stdout,
			Stderr:      os.Stderr,
			ExtraFiles:  []*os.File{w}, // fd 3 = childReportFd
			SysProcAttr: attr,
		}
		// Before Start, so a signal arriving at once is not lost; after
		// the command has gone, so nothing is sent to a reused pid.
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
		err = cmd.Start()
		w.Close()
		if err != nil {
			signal.Stop(sigs)
			r.Close()
			if !namespaceRefused(err) {
				return 0, fmt.Errorf("start %s: %w", runChildCommand, err)
			}
			refusals = append(refusals, namespaceRefusal(attr, err))
			continue
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for s := range sigs {
				if forwardSignal(s) {
					cmd.Process.Signal(s)
				}
			}
		}()
		// EOF with nothing read: the command was exec'd. A message: the
		// child failed before that and exits with the status it chose.
		report, _ := io.ReadAll(r)
		r.Close()
		waitErr := cmd.Wait()
		signal.Stop(sigs)
		close(sigs)
		<-done
		code := 0
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			ws := ee.Sys().(syscall.WaitStatus)
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
		} else if waitErr != nil {
			return 0, waitErr
		}
		if msg := strings.TrimSpace(string(report)); msg != "" {
			fmt.Fprintf(os.Stderr, "stagefs run: %s\n", msg)
			res.Error = msg
			if code == 0 {
				code = exitError
			}
		} else {
			res.Started = true
		}
		return code, nil
	}
	return 0, fmt.Errorf("cannot create a private mount namespace (%s): stagefs run needs root with CAP_SYS_ADMIN, or user namespaces that this user may create (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, a seccomp profile that allows them)",
		strings.Join(refusals, "; "))
}

// namespaceRefusal says which namespace the kernel refused and, for the
// errors that name no cause (EPERM, ENOSPC), the likely one.
func namespaceRefusal(attr *syscall.SysProcAttr, err error) string {
	if attr.Cloneflags&syscall.CLONE_NEWUSER == 0 {
		if errors.Is(err, syscall.EPERM) {
			return fmt.Sprintf("a mount namespace: %v, no CAP_SYS_ADMIN", err)
		}
		return fmt.Sprintf("a mount namespace: %v", err)
	}
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EUSERS):
		return fmt.Sprintf("a user namespace: %v, the limit user.max_user_namespaces is 0 or reached", err)
	case errors.Is(err, syscall.EPERM):
		return fmt.Sprintf("a user namespace: %v, unprivileged ones are disabled, filtered by seccomp or refused in a chroot", err)
	}
	return fmt.Sprintf("a user namespace: %v", err)
}

// namespaceRefused reports whether a failed start means the kernel would
// not make the namespace (rather than, say, a lack of memory).
func namespaceRefused(err error) bool {
	for _, e := range []error{syscall.EPERM, syscall.EACCES, syscall.EINVAL, syscall.ENOSPC, syscall.EUSERS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// namespaceAttrs lists the ways to make the child's mount namespace, in
// the order they are tried: as root a plain one (Go unshares it in the
// child before exec and makes / private there), then — for everyone — a
// user namespace mapping only the caller's uid and gid, which lets an
// unprivileged user mount inside it.
//
// In the user namespace the child keeps the caller's uid, so the command
// runs as the caller. A process that is not uid 0 loses its capabilities
// when it execs, the new namespace's included, so __run-child could not
// mount: CAP_SYS_ADMIN is kept across that exec as an ambient capability,
// and __run-child drops it again before it execs the command.
func namespaceAttrs() []*syscall.SysProcAttr {
	var out []*syscall.SysProcAttr
	if os.Geteuid() == 0 {
		out = append(out, &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS})
	}
	uid, gid := os.Geteuid(), os.Getegid()
	out = append(out, &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		GidMappingsEnableSetgroups: false,
		AmbientCaps:                []uintptr{unix.CAP_SYS_ADMIN},
	})
	return out
}

// dropMountCapability undoes, for the exec that follows on this thread,
// the ambient CAP_SYS_ADMIN that namespaceAttrs gave __run-child: without
// it in the ambient and inheritable sets, a command that is not uid 0
// starts with no capabilities and cannot unmount the staged view or the
// tmpfs over the state dir. Capabilities belong to a thread, so the caller
// must hold the thread (runtime.LockOSThread) until it execs.
func dropMountCapability() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_LOWER, unix.CAP_SYS_ADMIN, 0, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		// EINVAL: a kernel without ambient capabilities, which then gave
		// none.
		return fmt.Errorf("drop the ambient CAP_SYS_ADMIN: %v", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read the capabilities: %v", err)
	}
	data[unix.CAP_SYS_ADMIN/32].Inheritable &^= 1 << (unix.CAP_SYS_ADMIN % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop the inheritable CAP_SYS_ADMIN: %v", err)
	}
	return nil
}

// forwardSignal decides whether a signal run received goes on to the
// command. SIGTERM always does. SIGINT, SIGQUIT and SIGHUP come from the
// terminal to its whole foreground process group, the command included,
// so when run is in that group they are not sent a second time (a second
// Ctrl-C means "force quit" to some tools); sent to run alone (an agent
// host's kill), they are forwarded.
func forwardSignal(s os.Signal) bool {
	if s == syscall.SIGTERM {
		return true
	}
	return !inTerminalForeground()
}

func inTerminalForeground() bool {
	tty, err := os.Open("/dev/tty") // fails without a controlling terminal
	if err != nil {
		return false
	}
	defer tty.Close()
	fg, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGPGRP)
	return err == nil && fg == syscall.Getpgrp()
}

// summaryLines caps the summary: a build can touch thousands of paths, and
// an agent reads all of stderr.
const summaryLines = 40

// printRunSummary tells the user on stderr what the tool call changed: the
// pending changes at the paths it touched, then the touched paths that
// have none now (marked "(none)": a temporary file renamed or removed
// again, or a change committed or discarded meanwhile).
func printRunSummary(scope string, info control.SnapshotInfo, changes []control.StatusEntry) {
	fmt.Fprintf(os.Stderr, "stagefs: %s touched %d path(s)\n", scope, len(info.Paths))
	var lines []string
	pending := map[string]bool{}
	for _, e := range changes {
		pending[e.Path] = true
		what := e.Path
		if e.From != "" {
			what = e.From + " -> " + e.Path
		}
		lines = append(lines, fmt.Sprintf("  %-9s %s  %s", e.Kind, what, humanBytes(e.Bytes)))
	}
	for _, p := range info.Paths {
		if !pending[p] {
			lines = append(lines, fmt.Sprintf("  %-9s %s", "(none)", p))
		}
	}
	if len(lines) > summaryLines {
		more := len(lines) - summaryLines
		lines = append(lines[:summaryLines], fmt.Sprintf("  ... and %d more (stagefs snapshots, stagefs status)", more))
	}
	for _, l := range lines {
		fmt.Fprintln(os.Stderr, l)
	}
}

// runChild runs inside the new mount namespace: it makes the staged view
// appear at the workspace path, hides the state dir, and execs the command.
func runChild(ctx context.Context, args []string) error {
	// A signal forwarded before the exec would otherwise be lost; we check
	// for one just before exec'ing.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)

	var ws, mnt, state, workdir, outerNS string
	fs := pflag.NewFlagSet(runChildCommand, pflag.ContinueOnError)
	fs.StringVar(&ws, "workspace", "", "")
	fs.StringVar(&mnt, "mount", "", "")
	fs.StringVar(&state, "state", "", "")
	fs.StringVar(&workdir, "workdir", "", "")
	fs.StringVar(&outerNS, "outer-ns", "", "")
	fs.SetInterspersed(false)
	if err := fs.Parse(args); err != nil {
		return usagef("%s is internal: use stagefs run (%v)", runChildCommand, err)
	}
	if ws == "" || mnt == "" || state == "" || workdir == "" || outerNS == "" || fs.NArg() == 0 {
		return usagef("%s is internal: use stagefs run", runChildCommand)
	}
	// Never mount over the workspace in the caller's namespace, e.g. when
	// this command is run by hand.
	if ns, err := os.Readlink("/proc/self/ns/mnt"); err != nil || ns == outerNS {
		return fmt.Errorf("%s must run in a new mount namespace: use stagefs run", runChildCommand)
	}

	// From here on failures go to the parent, which prints them and tells
	// them apart from the command's own exit status.
	report := os.NewFile(childReportFd, "report")
	// The command must not inherit it; its closing on exec tells the
	// parent the command started.
	syscall.CloseOnExec(childReportFd)
	fail := func(code int, format string, a ...any) error {
		fmt.Fprintf(report, format+"\n", a...)
		return &exitStatus{code}
	}

	if err := setupNamespace(ws, mnt, state); err != nil {
		return fail(exitError, "%v", err)
	}
	if err := os.Chdir(workdir); err != nil {
		return fail(exitError, "working directory: %v", err)
	}

	argv := fs.Args()
	path, err := exec.LookPath(argv[0])
	if err != nil && !errors.Is(err, exec.ErrDot) {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return fail(exitNotFound, "%s: command not found", argv[0])
		}
		return fail(exitCannotExec, "%s: %v", argv[0], err)
	}
	// Shells believe an inherited $PWD that names the working directory
	// (a path under the mount would, as it is the same directory): make it
	// the path under the workspace.
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PWD=") {
			env = append(env, e)
		}
	}
	env = append(env, "PWD="+workdir)
	select {
	case s := <-sigs:
		return fail(128+int(s.(syscall.Signal)), "%s arrived before %s started", s, argv[0])
	default:
	}
	// The thread that drops the capability must be the one that execs.
	runtime.LockOSThread()
	if err := dropMountCapability(); err != nil {
		return fail(exitError, "%v", err)
	}
	signal.Reset()
	err = syscall.Exec(path, argv, env)
	if errors.Is(err, syscall.ENOENT) {
		return fail(exitNotFound, "%s: %v", argv[0], err)
	}
	return fail(exitCannotExec, "%s: %v", argv[0], err)
}

// setupNamespace makes this (new) mount namespace show the mount at the
// workspace path and hides the state dir.
func setupNamespace(ws, mnt, state string) error {
	// Nothing we mount may propagate back to the caller's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %v%s", err, userNSHint(err))
	}
	if err := unix.Mount(mnt, ws, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s over %s: %v%s", mnt, ws, err, userNSHint(err))
	}
	// A state dir under the workspace is already hidden by the mount
	// (ENOENT); anywhere else it is covered with an empty read-only tmpfs,
	// so neither it nor the control socket can be reached by path.
	st, err := os.Stat(state)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("state dir %s: %v", state, err)
	case !st.IsDir():
		return fmt.Errorf("state dir %s is not a directory", state)
	}
	if err := unix.Mount("stagefs-hidden", state, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555"); err != nil {
		return fmt.Errorf("hide the state dir %s: %v%s", state, err, userNSHint(err))
	}
	return nil
}

// userNSHint explains an EPERM inside an unprivileged user namespace, where
// some kernels (AppArmor, SELinux) allow the namespace but not mounts.
func userNSHint(err error) string {
	if !errors.Is(err, syscall.EPERM) || os.Getuid() == 0 {
		return ""
	}
	return " (this kernel lets unprivileged users create user namespaces but not mount in them, e.g. kernel.apparmor_restrict_unprivileged_userns=1; run as root or allow it)"
}

package main

// The daemon: `stagefs mount` starts it in the background (or runs it with
// --foreground). It takes the state dir's lock, opens the journal, starts
// the engine and finishes what a crash interrupted, mounts, answers the
// control socket and the hook channel with package backend, and unmounts
// on a signal.

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/backend"
	"stagefs/branch"
	"stagefs/control"
	"stagefs/journal"
	"stagefs/overlay"
	"stagefs/sandbox"
	"stagefs/snapshot"
)

// recovery is what a daemon found at start-up, for `stagefs mount` to tell
// the user: the pending set it kept, an interrupted commit it finished, the
// tool calls' snapshots still open, and a torn journal tail it cut.
type recovery struct {
	Pending          int             `json:"pending"`
	PendingBytes     int64           `json:"pendingBytes"`
	Commit           *commitRecovery `json:"commit,omitempty"`
	OpenSnapshots    int             `json:"openSnapshots"`
	TornJournalBytes int64           `json:"tornJournalBytes,omitempty"`
}

// commitRecovery is how an interrupted commit ended at start-up.
type commitRecovery struct {
	Committed int `json:"committed"`
	Conflicts int `json:"conflicts"`
	Failed    int `json:"failed"`
}

// runDaemon is the background daemon's entry point.
func runDaemon(ctx context.Context, args []string) error {
	var cfg mountConfig
	fs := mountFlags(daemonCommand, &cfg)
	fs.IntVar(&cfg.readyFd, "ready-fd", -1, "")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	if fs.NArg() != 2 {
		return usagef("internal: daemon needs WORKSPACE MOUNTPOINT")
	}
	cfg.workspace, cfg.mountpoint = fs.Arg(0), fs.Arg(1)
	var ready *os.File
	if cfg.readyFd >= 0 {
		ready = os.NewFile(uintptr(cfg.readyFd), "ready")
	}
	err := serve(ctx, &cfg, ready)
	if err != nil && ready != nil {
		fmt.Fprintf(ready, "error: %v\n", err)
		ready.Close()
	}
	return err
}

// serve runs the daemon: lock the state dir, recover, mount, answer the
// control socket, and unmount on a signal. ready, when set, gets "ready\n"
// once the mount serves.
func serve(ctx context.Context, cfg *mountConfig, ready *os.File) error {
	// The kernel applied the caller's umask to every mode it sends; ours
	// must not apply a second one.
	syscall.Umask(0)
	logger := log.New(os.Stderr, "stagefs: ", log.LstdFlags|log.Lmicroseconds)
	mode, err := overlay.ParseMode(cfg.mode)
	if err != nil {
		return err
	}
	lock, err := lockState(cfg.state)
	if err != nil {
		return err
	}
	defer lock.Close()
	// Before the mount is ready: no run of this mount may start with the
	// settings of an earlier daemon.
	if err := sandbox.SaveSettings(cfg.state, sandboxSettings(cfg)); err != nil {
		return err
	}
	branches := branch.NewManager(branch.Config{State: cfg.state, Workspace: cfg.workspace, Logf: logger.Printf})
	// The branches are served by this daemon too, each at its own mount
	// point, started before the main view mounts; they stop before it.
	var st *stage
	defer func() {
		branches.Close()
		if st != nil {
			st.close()
		}
	}()
	st, err = openStage(cfg, mode, stageOptions{
		branches: branches.Infos,
		register: func(s *control.Server) { control.RegisterBranches(s, branches) },
		beforeServe: func(st *stage) {
			if err := branches.Start(st.view(), &branchHost{cfg: cfg, mode: mode, manager: branches, logger: logger}); err != nil {
				logger.Printf("branches: %v", err)
			}
		},
	}, logger)
	if err != nil {
		return err
	}
	// Logged before the mount is reported ready, so it is there to read.
	logger.Printf("passthrough of pending bodies: %s", st.mfs.Passthrough())
	logger.Printf("FUSE transport: %s", st.mfs.Transport())
	if ready != nil {
		reportReady(ready, st.rec, st.b, st.snaps)
	}
	logger.Printf("serving %s over %s (state %s, mode %s)", cfg.mountpoint, cfg.workspace, cfg.state, mode)

	if path := os.Getenv("STAGEFS_CPUPROFILE"); path != "" {
		// For finding where the daemon's time goes (scripts/bench runs):
		// a CPU profile of the whole mount, written at unmount.
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	serveUntilUnmounted(ctx, st.mfs, cfg, logger)
	logger.Printf("FUSE transport at unmount: %s", st.mfs.Transport())
	return nil
}

// sandboxSettings is what the runs of the mount cfg describes may write
// outside the workspace.
func sandboxSettings(cfg *mountConfig) sandbox.Settings {
	return sandbox.Settings{Outside: cfg.outside, Allow: cfg.allow}
}

// engineOptions are the engine's options for the mount cfg describes; its
// callbacks are the backend's.
func engineOptions(cfg *mountConfig, mode overlay.Mode, jr *journal.Journal, snaps *snapshot.Store, b *backend.Backend, logf func(string, ...any)) overlay.Options {
	var hidden []string
	state := cfg.state
	if cfg.mainState != "" {
		state = cfg.mainState // a branch's is inside it
	}
	if within(state, cfg.workspace) {
		rel, _ := filepath.Rel(cfg.workspace, state)
		hidden = append(hidden, filepath.ToSlash(rel))
	}
	return overlay.Options{
		Workspace: cfg.workspace,
		StateDir:  cfg.state,
		Mode:      mode,
		Journal:   jr,
		OnChange:  b.PendingChanged,
		Logf:      logf,
		Hidden:    hidden,
		Snapshots: snaps,
		Turns:     overlay.TurnOptions{MaxTurns: cfg.maxTurns, MaxAge: cfg.maxTurnAge, NoCapture: cfg.noCapture},
		Deny:      cfg.deny,
		Hide:      cfg.hide,

		CaptureFailure:  cfg.captureFailure,
		JournalSync:     cfg.journalSync,
		OnCaptureFailed: b.CaptureFailed,
		// STAGEFS_PROGRESS_EVERY spaces progress reports (the tests
		// shorten it).
		ProgressEvery: envDuration("STAGEFS_PROGRESS_EVERY", 0),
		OnProgress:    b.Progress,
		OnRenumbered:  b.Renumbered,
	}
}

// reportReady tells `stagefs mount`, which waits on ready, that the mount
// serves, and what the daemon found from an earlier run.
func reportReady(ready *os.File, rec recovery, b *backend.Backend, snaps *snapshot.Store) {
	if st, err := b.Status(context.Background(), nil); err == nil {
		rec.Pending, rec.PendingBytes = st.PendingCount, st.TotalBytes
	}
	for _, s := range snaps.OpenSnapshots() {
		if !overlay.InternalScope(s.ScopeID) {
			rec.OpenSnapshots++
		}
	}
	line, _ := json.Marshal(rec)
	fmt.Fprintf(ready, "ready %s\n", line)
	ready.Close()
}

// mountServer is the FUSE server of the mount.
type mountServer interface {
	Wait()
	Unmount() error
}

// serveUntilUnmounted returns once the mount is gone: unmounted from
// outside (stagefs unmount), or by the daemon itself when ctx ends or a
// signal comes.
func serveUntilUnmounted(ctx context.Context, server mountServer, cfg *mountConfig, logger *log.Logger) {
	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	for {
		select {
		case <-done:
			logger.Printf("unmounted %s; the pending set is kept in %s", cfg.mountpoint, cfg.state)
			return
		case <-ctx.Done():
			unmountFromDaemon(server, cfg.mountpoint, logger)
		case s := <-sigs:
			logger.Printf("%v: unmounting", s)
			unmountFromDaemon(server, cfg.mountpoint, logger)
		}
	}
}

// serveHooks answers the hook channel on its abstract socket with b,
// until the returned server is closed.
func serveHooks(b *backend.Backend, state string, logger *log.Logger) (*control.Server, error) {
	name := control.HookSocketName(state)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("hook channel %s: %w", name, err)
	}
	// Everything in the sandbox can write to it: a hook's request is
	// small, and a longer line is refused.
	s := control.NewHookServer(backend.NewHookChannel(b, logger.Printf), control.ServerOptions{Logf: logger.Printf, MaxLineBytes: 1 << 20})
	go s.Serve(l)
	return s, nil
}

// unmountFromDaemon unmounts; when files are still open it detaches the
// mount lazily, and the daemon keeps serving until the last holder lets go.
func unmountFromDaemon(server interface{ Unmount() error }, mountpoint string, logger *log.Logger) {
	if err := server.Unmount(); err != nil {
		logger.Printf("unmount: %v; detaching lazily", err)
		lazyUnmount(mountpoint)
	}
}

func mountHint(err error) string {
	if os.Geteuid() != 0 {
		if _, lerr := exec.LookPath("fusermount3"); lerr != nil {
			return " (as a non-root user stagefs needs fusermount3: install the fuse3 package)"
		}
	}
	st, serr := os.Stat("/dev/fuse")
	if serr != nil {
		return " (/dev/fuse is missing: load the fuse module or give the container the device)"
	}
	if os.Geteuid() != 0 && unix.Access("/dev/fuse", unix.R_OK|unix.W_OK) != nil {
		// fusermount3 opens the device with the caller's rights.
		return fmt.Sprintf(" (/dev/fuse has mode %04o and is not open to uid %d: as root, `chmod 0666 /dev/fuse` (its usual mode), or mount as root)", st.Mode().Perm(), os.Geteuid())
	}
	return ""
}

// lockState takes the state dir's lock so two daemons never share it.
func lockState(state string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(state, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	// A daemon killed a moment ago is gone before the kernel has released
	// its lock (a dead process's files are closed asynchronously, and
	// its FUSE rings are torn down first): a restart waits for that, a
	// few seconds at most, but never for a daemon that is alive.
	deadline := time.Now().Add(3 * time.Second)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		pid, _ := os.ReadFile(filepath.Join(state, "pid"))
		if err != syscall.EWOULDBLOCK || daemonAlive(string(pid)) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another stagefs daemon (pid %s) is using the state dir %s; unmount it first or pass another --state", string(pid), state)
		}
		time.Sleep(10 * time.Millisecond)
	}
	os.WriteFile(filepath.Join(state, "pid"), []byte(fmt.Sprint(os.Getpid())), 0o600)
	return f, nil
}

// daemonAlive reports whether the process of the pid file's text runs
// (not a zombie); an unreadable pid counts as alive.
func daemonAlive(pidText string) bool {
	pid, err := strconv.Atoi(strings.TrimSpace(pidText))
	if err != nil || pid <= 0 {
		return true
	}
	if syscall.Kill(pid, 0) == syscall.ESRCH {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// clearStaleMount removes a mount left by a killed daemon (its mount point
// answers ENOTCONN) and refuses a live one.
func clearStaleMount(mp string) error {
	if _, ok := isMounted(mp); !ok {
		return nil
	}
	// statfs always reaches the daemon; stat may be answered from the
	// kernel's attribute cache for a while after the daemon died.
	var st syscall.Statfs_t
	err := syscall.Statfs(mp, &st)
	if err == nil {
		return fmt.Errorf("%s is already a mount point; unmount it first (stagefs unmount %s)", mp, mp)
	}
	if err != syscall.ENOTCONN && err != syscall.ECONNABORTED {
		return fmt.Errorf("%s: %w", mp, err)
	}
	if err := lazyUnmount(mp); err != nil {
		return fmt.Errorf("clear the dead mount at %s: %w", mp, err)
	}
	return nil
}

func lazyUnmount(mp string) error {
	if os.Geteuid() == 0 {
		return syscall.Unmount(mp, syscall.MNT_DETACH)
	}
	return exec.Command("fusermount3", "-u", "-z", mp).Run()
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/fusefs"
	"stagefs/journal"
	"stagefs/overlay"
	"stagefs/sandbox"
	"stagefs/snapshot"
)

func parseMode(s string) (overlay.Mode, error) { return overlay.ParseMode(s) }

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

// serve runs the daemon: lock the state dir, recover, mount, answer the
// control socket, and unmount on a signal. ready, when set, gets "ready\n"
// once the mount serves.
func serve(ctx context.Context, cfg *mountConfig, ready *os.File) error {
	// The kernel applied the caller's umask to every mode it sends; ours
	// must not apply a second one.
	syscall.Umask(0)
	logger := log.New(os.Stderr, "stagefs: ", log.LstdFlags|log.Lmicroseconds)
	mode, err := parseMode(cfg.mode)
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
	if err := sandbox.SaveSettings(cfg.state, sandbox.Settings{Outside: cfg.outside, Allow: cfg.allow}); err != nil {
		return err
	}
	if err := clearStaleMount(cfg.mountpoint); err != nil {
		return err
	}
	jr, info, err := journal.Open(filepath.Join(cfg.state, "journal.log"), journal.Options{})
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer jr.Close()
	// At a clean exit nothing is in flight: the next start reads only what
	// comes after (deferred after Close, so it runs first). Only once the
	// start-up has finished what a crash interrupted: an early error must
	// leave an unfinished commit where the next start looks for it.
	recovered := false
	defer func() {
		if !recovered {
			return
		}
		if err := jr.Checkpoint(); err != nil {
			logger.Printf("%v", err)
		}
	}()
	if info.TornBytes > 0 {
		logger.Printf("journal: cut a torn tail of %d bytes (kept in %s)", info.TornBytes, info.BrokenCopy)
	}
	unfinished, err := unfinishedCommit(jr, info.CheckpointSeq)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	snaps, err := snapshot.Open(filepath.Join(cfg.state, "snapshots"), snapshot.Options{ByteCap: cfg.snapshotCap, Lazy: overlay.ToolCallScope, Workspace: cfg.workspace})
	if err != nil {
		return fmt.Errorf("snapshots: %w", err)
	}
	var hidden []string
	if within(cfg.state, cfg.workspace) {
		rel, _ := filepath.Rel(cfg.workspace, cfg.state)
		hidden = append(hidden, filepath.ToSlash(rel))
	}
	b := &backend{cfg: cfg, journal: jr, sessionID: newSessionID(), started: time.Now(), wake: make(chan struct{}, 1)}
	eng, err := overlay.New(overlay.Options{
		Workspace: cfg.workspace,
		StateDir:  cfg.state,
		Mode:      mode,
		Journal:   jr,
		OnChange:  b.pendingChanged,
		Logf:      logger.Printf,
		Hidden:    hidden,
		Snapshots: snaps,
		Turns:     overlay.TurnOptions{MaxTurns: cfg.maxTurns, MaxAge: cfg.maxTurnAge, NoCapture: cfg.noCapture},
		Deny:      cfg.deny,
		Hide:      cfg.hide,

		CaptureFailure:  cfg.captureFailure,
		JournalSync:     cfg.journalSync,
		OnCaptureFailed: b.captureFailed,
		// STAGEFS_PROGRESS_EVERY spaces progress reports (the tests
		// shorten it).
		ProgressEvery: envDuration("STAGEFS_PROGRESS_EVERY", 0),
		OnProgress: func(p overlay.Progress) {
			b.publish(control.Event{Kind: control.EventProgress, Detail: p.Op, Done: p.Done, Total: p.Total, Bytes: p.Bytes, Final: p.Final})
		},
		OnRenumbered: func(paths []string) {
			if b.fs != nil {
				b.fs.Invalidate(paths)
			}
		},
	})
	if err != nil {
		return err
	}
	defer eng.Close()
	b.eng, b.snaps = eng, snaps
	var rec recovery
	rec.TornJournalBytes = info.TornBytes
	if len(unfinished) > 0 {
		res := eng.Recover(unfinished)
		logger.Printf("finished an interrupted commit: %d committed, %d conflicts, %d failed", len(res.Committed), len(res.Conflicts), len(res.Failed))
		rec.Commit = &commitRecovery{Committed: len(res.Committed), Conflicts: len(res.Conflicts), Failed: len(res.Failed)}
	}
	// Recovered, and nothing in flight yet: later starts begin here,
	// unless the commit could not be finished (Recover could not even
	// journal its own begin): then the next start must see it again.
	if left, err := unfinishedCommit(jr, info.CheckpointSeq); err == nil && len(left) == 0 {
		recovered = true
		if err := jr.Checkpoint(); err != nil {
			logger.Printf("%v", err)
		}
	}
	mfs, err := fusefs.Mount(cfg.mountpoint, eng, fusefs.Options{
		Timeout:       cfg.timeout,
		Debug:         cfg.debug,
		NoPassthrough: cfg.noPassthrough,
		Name:          stagefsSourcePrefix + cfg.state,
		Logf:          logger.Printf,
	})
	if err != nil {
		// go-fuse ends some messages with a newline; the hint goes on the same line.
		return fmt.Errorf("mount %s: %s%s", cfg.mountpoint, strings.TrimSpace(err.Error()), mountHint(err))
	}
	b.fs = mfs
	server := mfs.Server()
	l, err := control.Listen(socketPath(cfg.state))
	if err != nil {
		server.Unmount()
		return fmt.Errorf("control socket: %w", err)
	}
	ctl := control.NewServer(b, control.ServerOptions{Logf: logger.Printf})
	b.registerSnapshots(ctl)
	b.registerTurns(ctl)
	b.ctl = ctl
	go ctl.Serve(l)
	go b.publishLoop()
	defer func() {
		ctl.Close()
		os.Remove(socketPath(cfg.state))
	}()
	hooks, err := newHookChannel(b, logger.Printf).serve(control.HookSocketName(cfg.state))
	if err != nil {
		server.Unmount()
		return err
	}
	defer hooks.Close()
	// Logged before the mount is reported ready, so it is there to read.
	logger.Printf("passthrough of pending bodies: %s", mfs.Passthrough())
	if ready != nil {
		if st, err := b.Status(context.Background(), nil); err == nil {
			rec.Pending, rec.PendingBytes = st.PendingCount, st.TotalBytes
		}
		for _, s := range snaps.OpenSnapshots() {
			if !reservedScope(s.ScopeID) {
				rec.OpenSnapshots++
			}
		}
		line, _ := json.Marshal(rec)
		fmt.Fprintf(ready, "ready %s\n", line)
		ready.Close()
	}
	logger.Printf("serving %s over %s (state %s, mode %s)", cfg.mountpoint, cfg.workspace, cfg.state, mode)

	if path := os.Getenv("STAGEFS_CPUPROFILE"); path != "" {
		// For finding where the daemon's time goes (scripts/bench runs):
		// a CPU profile of the whole mount, written at unmount.
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	done := make(chan struct{})
	go func() { server.Wait(); close(done) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	for {
		select {
		case <-done:
			logger.Printf("unmounted %s; the pending set is kept in %s", cfg.mountpoint, cfg.state)
			return nil
		case <-ctx.Done():
			unmountFromDaemon(server, cfg.mountpoint, logger)
		case s := <-sigs:
			logger.Printf("%v: unmounting", s)
			unmountFromDaemon(server, cfg.mountpoint, logger)
		}
	}
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
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(filepath.Join(state, "pid"))
		f.Close()
		return nil, fmt.Errorf("another stagefs daemon (pid %s) is using the state dir %s; unmount it first or pass another --state", string(pid), state)
	}
	os.WriteFile(filepath.Join(state, "pid"), []byte(fmt.Sprint(os.Getpid())), 0o600)
	return f, nil
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

// unfinishedCommit returns the paths of the last commit the journal shows
// begun but not ended (a crash in the middle).
// The scan starts after the journal's checkpoint: none was taken with a
// commit in flight.
func unfinishedCommit(jr *journal.Journal, since uint64) ([]string, error) {
	var pending []string
	err := jr.Scan(since, func(r journal.Record) error {
		rec, err := overlay.DecodeRecord(r.Seq, r.Payload)
		if err != nil {
			return nil // not an engine record; nothing to finish
		}
		switch rec.Op {
		case "commit_begin":
			pending = nil
			json.Unmarshal([]byte(rec.Detail), &pending)
		case "commit_end":
			pending = nil
		}
		return nil
	})
	return pending, err
}

func newSessionID() string {
	var b [8]byte
	f, err := os.Open("/dev/urandom")
	if err == nil {
		f.Read(b[:])
		f.Close()
	}
	return fmt.Sprintf("sess_%x", b)
}

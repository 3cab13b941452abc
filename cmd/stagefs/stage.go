package main

// A stage is one view the daemon serves: a pending set (its journal,
// snapshot store and engine), its FUSE mount, its control socket and its
// hook channel. The mount's main view is one; each branch is another
// (package branch keeps them).

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"stagefs/backend"
	"stagefs/branch"
	"stagefs/control"
	"stagefs/fusefs"
	"stagefs/journal"
	"stagefs/overlay"
	"stagefs/sandbox"
	"stagefs/snapshot"
)

type stage struct {
	cfg    *mountConfig
	logger *log.Logger
	jr     *journal.Journal
	snaps  *snapshot.Store
	b      *backend.Backend
	eng    *overlay.Engine
	mfs    *fusefs.FS
	ctl    *control.Server
	hooks  *control.Server
	rec    recovery
	// recovered: start-up finished what a crash interrupted, so the
	// journal may be checkpointed at a clean close.
	recovered bool
	// merge is a merge into this view a crash interrupted, for package
	// branch to finish.
	merge   *overlay.MergeIntent
	closers []func()
}

// stageOptions say what differs between the main view and a branch.
type stageOptions struct {
	branch   string                      // "" for the main view
	branches func() []control.BranchInfo // for session/initialize
	// register adds methods to the control server before it serves.
	register func(*control.Server)
	// beforeServe runs once the pending set is open and recovered,
	// before the view is mounted: the main view's branches start there,
	// so that a merge into it a crash interrupted is finished before any
	// process can see or change the view.
	beforeServe func(*stage)
}

// openStage opens the pending set in cfg.state, finishes what a crash
// interrupted, mounts it at cfg.mountpoint and serves its control socket
// and hook channel. On error nothing is left open.
func openStage(cfg *mountConfig, mode overlay.Mode, opts stageOptions, logger *log.Logger) (_ *stage, err error) {
	st := &stage{cfg: cfg, logger: logger}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	if err := clearStaleMount(cfg.mountpoint); err != nil {
		return nil, err
	}
	jr, info, err := journal.Open(filepath.Join(cfg.state, "journal.log"), journal.Options{})
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	st.jr = jr
	st.closers = append(st.closers, func() {
		// At a clean exit nothing is in flight: the next start reads
		// only what comes after. Only once the start-up has finished
		// what a crash interrupted: an early error must leave an
		// unfinished commit where the next start looks for it.
		if st.recovered {
			if err := jr.Checkpoint(); err != nil {
				logger.Printf("%v", err)
			}
		}
		jr.Close()
	})
	if info.TornBytes > 0 {
		logger.Printf("journal: cut a torn tail of %d bytes (kept in %s)", info.TornBytes, info.BrokenCopy)
	}
	unfinished, merge, err := overlay.Unfinished(jr, info.CheckpointSeq)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	st.merge = merge
	snaps, err := snapshot.Open(filepath.Join(cfg.state, "snapshots"), snapshot.Options{ByteCap: cfg.snapshotCap, Lazy: overlay.ToolCallScope, Workspace: cfg.workspace})
	if err != nil {
		return nil, fmt.Errorf("snapshots: %w", err)
	}
	st.snaps = snaps
	// The backend before the engine: the engine's callbacks are its.
	st.b = backend.New(backend.Config{
		Version:   version,
		Workspace: cfg.workspace,
		Mount:     cfg.mountpoint,
		StateDir:  cfg.state,
		Journal:   jr,
		Deny:      cfg.deny,
		Hide:      cfg.hide,
		Sandbox:   sandboxSettings(cfg),
		Branch:    opts.branch,
		Branches:  opts.branches,
	})
	eng, err := overlay.New(engineOptions(cfg, mode, jr, snaps, st.b, logger.Printf))
	if err != nil {
		return nil, err
	}
	st.eng = eng
	st.closers = append(st.closers, func() { eng.Close() })
	st.rec.TornJournalBytes = info.TornBytes
	if len(unfinished) > 0 {
		res := eng.Recover(unfinished)
		logger.Printf("finished an interrupted commit: %d committed, %d conflicts, %d failed", len(res.Committed), len(res.Conflicts), len(res.Failed))
		st.rec.Commit = &commitRecovery{Committed: len(res.Committed), Conflicts: len(res.Conflicts), Failed: len(res.Failed)}
	}
	// Recovered, and nothing in flight yet: later starts begin here,
	// unless the commit could not be finished (Recover could not even
	// journal its own begin): then the next start must see it again.
	// An unfinished merge too keeps the journal from its checkpoint.
	if left, err := overlay.UnfinishedCommit(jr, info.CheckpointSeq); err == nil && len(left) == 0 && st.merge == nil {
		st.recovered = true
		if err := jr.Checkpoint(); err != nil {
			logger.Printf("%v", err)
		}
	}
	if opts.beforeServe != nil {
		opts.beforeServe(st)
	}
	mfs, err := fusefs.Mount(cfg.mountpoint, eng, fusefs.Options{
		Timeout:       cfg.timeout,
		Debug:         cfg.debug,
		NoPassthrough: cfg.noPassthrough,
		URing:         cfg.transport == transportURing,
		Name:          stagefsSourcePrefix + cfg.state,
		Logf:          logger.Printf,
	})
	if err != nil {
		// go-fuse ends some messages with a newline; the hint goes on the same line.
		return nil, fmt.Errorf("mount %s: %s%s", cfg.mountpoint, strings.TrimSpace(err.Error()), mountHint(err))
	}
	st.mfs = mfs
	st.closers = append(st.closers, func() {
		// A branch's mount goes with it; the main view's is gone by now
		// (its unmount ends the daemon), so this finds nothing to do.
		if _, ok := isMounted(cfg.mountpoint); ok {
			unmountFromDaemon(mfs, cfg.mountpoint, logger)
		}
	})
	l, err := control.Listen(socketPath(cfg.state))
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	st.ctl = control.NewServer(st.b, control.ServerOptions{Logf: logger.Printf})
	if opts.register != nil {
		opts.register(st.ctl)
	}
	st.b.Start(eng, snaps, mfs, st.ctl)
	go st.ctl.Serve(l)
	st.closers = append(st.closers, func() {
		st.ctl.Close()
		os.Remove(socketPath(cfg.state))
	})
	hooks, err := serveHooks(st.b, cfg.state, logger)
	if err != nil {
		return nil, err
	}
	st.hooks = hooks
	st.closers = append(st.closers, func() { hooks.Close() })
	return st, nil
}

// close stops what openStage started, last first.
func (st *stage) close() {
	for i := len(st.closers) - 1; i >= 0; i-- {
		st.closers[i]()
	}
	st.closers = nil
}

// view is what package branch needs of the stage.
func (st *stage) view() branch.View {
	return branch.View{
		Engine:    st.eng,
		Snapshots: st.snaps,
		StateDir:  st.cfg.state,
		Mount:     st.cfg.mountpoint,
		Socket:    socketPath(st.cfg.state),
		Close:     st.close,
		// Read when called: the main view's is made before it mounts.
		Invalidate: func(paths []string) {
			if st.mfs != nil {
				st.mfs.Invalidate(paths)
			}
		},
		InUse: func() bool { return sandbox.ScratchInUse(st.cfg.state) },
		Unmount: func() error {
			if st.mfs == nil {
				return nil
			}
			return st.mfs.Unmount()
		},
		UnfinishedMerge: st.merge,
	}
}

// branchHost opens branches as stages of this daemon, with the mount's
// own settings.
type branchHost struct {
	cfg     *mountConfig
	mode    overlay.Mode
	manager *branch.Manager
	logger  *log.Logger
}

func (h *branchHost) OpenBranch(name, stateDir, mountpoint string) (branch.View, error) {
	cfg := *h.cfg
	cfg.state, cfg.mountpoint, cfg.mainState = stateDir, mountpoint, h.cfg.state
	if err := sandbox.SaveSettings(stateDir, sandboxSettings(&cfg)); err != nil {
		return branch.View{}, err
	}
	st, err := openStage(&cfg, overlay.Staged, stageOptions{
		branch:   name,
		branches: h.manager.Infos,
		register: func(s *control.Server) { control.RegisterBranches(s, h.manager) },
	}, h.logger)
	if err != nil {
		return branch.View{}, err
	}
	return st.view(), nil
}

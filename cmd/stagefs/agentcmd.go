package main

// stagefs claude (and the other agents): run a coding agent unchanged at
// the workspace's own path inside the staged view, with its hooks wired to
// the daemon, so every prompt is a turn and every tool call a snapshot.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"stagefs/agents"
	"stagefs/control"
	"stagefs/overlay"
	"stagefs/sandbox"
)

func runClaude(ctx context.Context, args []string) error { return runAgent(ctx, &agents.Claude, args) }
func runCodex(ctx context.Context, args []string) error  { return runAgent(ctx, &agents.Codex, args) }
func runGemini(ctx context.Context, args []string) error { return runAgent(ctx, &agents.Gemini, args) }

// runAgent is `stagefs AGENT [-m MOUNTPOINT | mount flags] [--workspace
// DIR] [--AGENT PATH] [-- AGENT_ARGS...]`.
func runAgent(ctx context.Context, a *agents.Agent, args []string) error {
	usage := fmt.Sprintf("usage: stagefs %s [-m MOUNTPOINT | mount flags] [--workspace DIR] [--%s PATH] [-- %s_ARGS...]", a.Name, a.Name, strings.ToUpper(a.Name))
	var cfg mountConfig
	fs := mountFlags(a.Name, &cfg)
	var mnt, workspace, bin, branchName string
	var noBind bool
	fs.StringVarP(&mnt, "mount", "m", "", "join the stagefs mount at MOUNTPOINT")
	fs.StringVar(&branchName, "branch", "", "run in this branch of the mount (stagefs branches lists them)")
	if a.RewriteInput != nil {
		fs.BoolVar(&noBind, "no-bind", false, "leave shell commands unchanged (they are then attributed by time, not by process tree)")
	}
	fs.StringVar(&workspace, "workspace", "", "the workspace (default: the current directory's)")
	fs.StringVar(&bin, a.Name, "", "the agent's binary (default: "+a.Binary+" on PATH)")
	if err := fs.Parse(args); err != nil {
		return usagef("%s: %v\n%s", a.Name, err, usage)
	}
	agentArgs := fs.Args()
	if n := fs.ArgsLenAtDash(); n > 0 {
		return usagef("%s: unexpected %q before --\n%s", a.Name, agentArgs[0], usage)
	}

	// The agent first: a missing agent should not leave a mount behind.
	if bin == "" {
		bin = a.Binary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return fmt.Errorf("%s not found (%v): install it with `npm install -g %s`, or pass --%s PATH", bin, err, a.Package, a.Name)
	}
	if path, err = filepath.Abs(path); err != nil {
		return err
	}

	c, init, err := joinOrMount(ctx, a.Name, &cfg, fs.Changed, mnt, workspace)
	if err == nil {
		c, init, err = intoBranch(ctx, c, init, branchName)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	m, ok := isMounted(init.Mount)
	if !ok || !strings.HasPrefix(m.source, stagefsSourcePrefix) {
		return fmt.Errorf("the daemon's mount point %s is not a stagefs mount in this mount namespace", init.Mount)
	}
	dir, err := runWorkdir("", init.Workspace, init.Mount)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// The agent's settings layer lives outside the state dir, which the
	// sandbox hides, for as long as the agent runs.
	scratch, err := os.MkdirTemp("", "stagefs-"+a.Name+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	wireArgs, wireEnv, err := a.Wire(agents.ShellQuote(self)+" hook "+a.Name, scratch)
	if err != nil {
		return err
	}
	env := append([]string{
		agents.EnvHookSocket + "=" + init.HookSocket,
		agents.EnvWorkspace + "=" + init.Workspace,
	}, wireEnv...)
	if noBind {
		env = append(env, agents.EnvNoBind+"=1")
	}
	if a.Preflight != nil {
		if err := a.Preflight(path, env); err != nil {
			return err
		}
	}

	started := time.Now()
	res, err := sandbox.Run(sandbox.Spec{
		Workspace: init.Workspace,
		Mount:     init.Mount,
		State:     strings.TrimPrefix(m.source, stagefsSourcePrefix),
		Workdir:   dir,
		Argv:      append(append([]string{path}, wireArgs...), agentArgs...),
		Env:       env,
		Expose:    []string{scratch}, // in the host's /tmp, which the sandbox replaces
		Forward:   forwardSignal,
	})
	if err != nil {
		return err
	}
	bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	printAgentSummary(bg, a, c, init, started, res.Code)
	if res.Code != 0 {
		return &exitStatus{res.Code}
	}
	return nil
}

// intoBranch switches c, a client of a mount's view described by init, to
// the mount's branch name, when name is set.
func intoBranch(ctx context.Context, c *control.Client, init control.InitializeResult, name string) (*control.Client, control.InitializeResult, error) {
	if name == "" {
		return c, init, nil
	}
	bc, err := dialBranch(c, name)
	if err != nil {
		return nil, init, err
	}
	binit, err := bc.Initialize(ctx)
	if err != nil {
		bc.Close()
		return nil, init, err
	}
	return bc, binit, nil
}

// joinOrMount connects to the daemon serving the workspace (-m, or the
// current directory's workspace or mount) or, when none does, mounts it
// with the default state dir and a mount point inside that state dir. The
// mount stays when the agent exits, so the user can review and commit.
func joinOrMount(ctx context.Context, name string, cfg *mountConfig, changed func(string) bool, mnt, workspace string) (*control.Client, control.InitializeResult, error) {
	if mnt != "" {
		cf := &clientFlags{mount: mnt}
		c, err := cf.dial()
		if err != nil {
			return nil, control.InitializeResult{}, err
		}
		init, err := c.Initialize(ctx)
		if err != nil {
			c.Close()
			return nil, init, err
		}
		return c, init, nil
	}
	if workspace == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, control.InitializeResult{}, err
		}
		workspace = wd
	}
	ws, err := filepath.Abs(workspace)
	if err != nil {
		return nil, control.InitializeResult{}, err
	}
	if c, init := daemonForWorkspacePath(ctx, ws); c != nil {
		if init.Workspace != ws && workspace != "" && changed("workspace") {
			c.Close()
			return nil, init, fmt.Errorf("%s is inside the workspace %s, which stagefs serves already; pass --workspace %s or -m %s", ws, init.Workspace, init.Workspace, init.Mount)
		}
		warnIgnoredMountFlags(name, changed)
		return c, init, nil
	}
	// The current directory may be a mount's own path.
	cf := &clientFlags{}
	if c, err := cf.dial(); err == nil {
		init, err := c.Initialize(ctx)
		if err == nil {
			warnIgnoredMountFlags(name, changed)
			return c, init, nil
		}
		c.Close()
	}

	real, err := realDir(ws, "workspace")
	if err != nil {
		return nil, control.InitializeResult{}, err
	}
	if cfg.state == "" {
		if cfg.state, err = defaultStateDir(real); err != nil {
			return nil, control.InitializeResult{}, err
		}
	}
	point := filepath.Join(cfg.state, "view")
	if err := os.MkdirAll(point, 0o700); err != nil {
		return nil, control.InitializeResult{}, fmt.Errorf("make the mount point: %w", err)
	}
	if err := cfg.resolve(real, point); err != nil {
		return nil, control.InitializeResult{}, err
	}
	if err := startBackground(cfg); err != nil {
		return nil, control.InitializeResult{}, err
	}
	fmt.Fprintf(os.Stderr, "stagefs: mounted the staged view of %s at %s (state %s)\n", cfg.workspace, cfg.mountpoint, cfg.state)
	printRecovered(os.Stderr, cfg.recovered)
	c, err := control.Dial(socketPath(cfg.state))
	if err != nil {
		return nil, control.InitializeResult{}, &noDaemonError{err}
	}
	init, err := c.Initialize(ctx)
	if err != nil {
		c.Close()
		return nil, init, err
	}
	return c, init, nil
}

// warnIgnoredMountFlags says that mount flags do not change a daemon that
// runs already.
func warnIgnoredMountFlags(name string, changed func(string) bool) {
	var set []string
	for _, f := range []string{"state", "mode", "deny", "hide", "no-capture", "snapshot-cap", "max-turns", "max-turn-age", "capture-failure", "journal-sync", "cache-timeout", "no-passthrough", "debug", "foreground", "outside", "allow"} {
		if changed(f) {
			set = append(set, "--"+f)
		}
	}
	if len(set) > 0 {
		fmt.Fprintf(os.Stderr, "stagefs %s: a daemon serves this workspace already; %s apply only to a new mount (stagefs unmount it first)\n", name, strings.Join(set, ", "))
	}
}

// printAgentSummary tells the user on stderr, when the agent has exited,
// what the session left and how to review, undo and commit it.
func printAgentSummary(ctx context.Context, a *agents.Agent, c *control.Client, init control.InitializeResult, since time.Time, code int) {
	w := os.Stderr
	st, err := c.Status(ctx, nil)
	if err != nil {
		fmt.Fprintf(w, "stagefs: %s exited (status %d); the daemon did not answer (%v): mount the workspace again with `stagefs mount`, nothing staged is lost\n", a.Name, code, err)
		return
	}
	turns, calls := 0, 0
	lastTurn, lastCall := "", ""
	if cp, err := c.Checkpoints(ctx); err == nil {
		for _, t := range cp.Turns {
			if started, err := time.Parse(time.RFC3339Nano, t.Started); err == nil && !started.Before(since) {
				turns++
				if lastTurn == "" {
					lastTurn = t.TurnID // newest first
				}
			}
		}
	}
	if ls, err := c.ListSnapshots(ctx); err == nil {
		for _, s := range ls.Snapshots {
			created, err := time.Parse(time.RFC3339Nano, s.Created)
			if err != nil || created.Before(since) || overlay.InternalScope(s.ScopeID) {
				continue
			}
			calls++
			if len(s.Paths) > 0 {
				lastCall = s.ScopeID
			}
		}
	}
	m := "-m " + agents.ShellQuote(init.Mount)
	fmt.Fprintf(w, "\nstagefs: %s exited (status %d). This session: %d turn(s), %d tool call(s).\n", a.Name, code, turns, calls)
	fmt.Fprintf(w, "  %d path(s) pending, %s, in %s (the workspace is unchanged until you commit)\n", st.PendingCount, humanBytes(st.TotalBytes), init.Workspace)
	fmt.Fprintf(w, "  review:          stagefs status %s; stagefs diff %s\n", m, m)
	if lastCall == "" {
		lastCall = "TOOL_CALL_ID"
	}
	fmt.Fprintf(w, "  undo a tool call: stagefs restore %s %s   (stagefs snapshots %s lists them)\n", m, lastCall, m)
	if lastTurn == "" {
		lastTurn = "TURN"
	}
	fmt.Fprintf(w, "  roll back a prompt: stagefs rollback %s %s   (stagefs checkpoints %s; stagefs redo %s)\n", m, lastTurn, m, m)
	if init.Branch != "" {
		// A branch reaches the workspace through its parent, and its
		// mount goes with it.
		fmt.Fprintf(w, "  since its fork:  stagefs diff %s --branch %s\n", m, init.Branch)
		fmt.Fprintf(w, "  merge:           stagefs merge %s %s [PATH...]   (into its parent; commit there)\n", m, init.Branch)
		fmt.Fprintf(w, "  drop it:         stagefs branch %s --drop %s\n", m, init.Branch)
	} else {
		fmt.Fprintf(w, "  commit:          stagefs commit %s [PATH...]\n", m)
		fmt.Fprintf(w, "  unmount:         stagefs unmount %s\n", agents.ShellQuote(init.Mount))
	}
	if a.Note != "" {
		fmt.Fprintf(w, "  note: %s\n", a.Note)
	}
}

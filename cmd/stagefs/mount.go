package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"stagefs/control"
	"stagefs/overlay"
	"stagefs/sandbox"
)

// defaultJournalSync is the disk's own contract: a staging record is
// written before its operation is answered (a killed daemon loses
// nothing) and durable at the next fsync in the mount, or within this
// time, as ext4 makes a file's changes durable at fsync or its journal
// commit. --journal-sync 0 makes every record durable before its answer.
const defaultJournalSync = 100 * time.Millisecond

// The FUSE transports (--fuse-transport). io_uring where the kernel and the
// daemon's rights allow (it answers a create, an unlink or a lookup in
// half the time, docs/performance.md), else /dev/fuse, which it falls back
// to by itself. STAGEFS_FUSE_TRANSPORT sets the default, so a whole test
// suite or bench can run over either.
const (
	transportDev   = "dev"
	transportURing = "io_uring"
)

func defaultTransport() string {
	if t := os.Getenv("STAGEFS_FUSE_TRANSPORT"); t != "" {
		return t
	}
	return transportURing
}

// daemonCommand is the hidden subcommand the background daemon runs as.
const daemonCommand = "__daemon"

// mountConfig is everything mount and the daemon need.
type mountConfig struct {
	workspace, mountpoint, state string
	mode                         string
	foreground, debug            bool
	noPassthrough                bool
	transport                    string
	readyFd                      int
	timeout                      time.Duration
	snapshotCap                  int64
	maxTurns                     int
	maxTurnAge                   time.Duration
	noCapture                    []string
	deny, hide                   []string
	captureFailure               string
	journalSync                  time.Duration
	// What the sandboxes of stagefs run and the agent commands may write
	// outside the workspace (package sandbox): outside is "ro" or "rw";
	// allow holds real paths writable for real.
	outside   string
	allow     []string
	recovered recovery // what the daemon found at start-up
	// mainState is the mount's state dir when this config serves one of
	// its branches (whose state dir is inside it); "" for the main view.
	mainState string
}

func mountFlags(name string, cfg *mountConfig) *pflag.FlagSet {
	fs := newFlagSet(name)
	fs.StringVar(&cfg.state, "state", "", "state dir (default: $XDG_STATE_HOME/stagefs/NAME-HASH, else ~/.local/state/stagefs/NAME-HASH)")
	fs.StringVar(&cfg.mode, "mode", "staged", "write mode: staged or immediate")
	fs.BoolVar(&cfg.foreground, "foreground", false, "stay attached; unmount on SIGINT/SIGTERM")
	fs.BoolVar(&cfg.debug, "debug", false, "log every FUSE request")
	fs.DurationVar(&cfg.timeout, "cache-timeout", time.Second, "how long the kernel caches names and attributes where no workspace watch covers them (watched: a minute)")
	fs.IntVar(&cfg.maxTurns, "max-turns", 50, "turns kept for rollback")
	fs.DurationVar(&cfg.maxTurnAge, "max-turn-age", 7*24*time.Hour, "turns older than this are pruned")
	fs.StringArrayVar(&cfg.noCapture, "no-capture", nil, "glob of paths staged without capturing pre-images (repeatable)")
	fs.StringVar(&cfg.captureFailure, "capture-failure", "allow", "when a pre-image cannot be stored: allow (mark the snapshot incomplete) or deny (fail the write with ENOSPC)")
	fs.StringArrayVar(&cfg.deny, "deny", nil, "glob of paths that are read-only through the mount (repeatable)")
	fs.StringArrayVar(&cfg.hide, "hide", nil, "glob of paths that are invisible through the mount (repeatable)")
	fs.BoolVar(&cfg.noPassthrough, "no-passthrough", false, "keep all file I/O in the daemon (by default, as root on Linux 6.9+, the kernel reads and writes pending bodies directly)")
	fs.StringVar(&cfg.transport, "fuse-transport", defaultTransport(), "how the kernel's requests reach the daemon: io_uring (Linux 6.14+, as root; the daemon sets the kernel's enable_uring parameter; falls back to dev where it cannot, saying why in daemon.log) or dev (read and write on /dev/fuse)")
	fs.DurationVar(&cfg.journalSync, "journal-sync", defaultJournalSync, "how long a staging operation's journal record may wait to be durable: it is written before the operation is answered, and made durable by the next fsync in the mount or within this time; 0: durable before each operation is answered (docs/guarantees.md)")
	fs.Int64Var(&cfg.snapshotCap, "snapshot-cap", 1<<30, "bytes of snapshot pre-images kept; the oldest closed snapshots are evicted past it")
	fs.StringVar(&cfg.outside, "outside", sandbox.OutsideReadOnly, "what stagefs run and the agent commands may write outside the workspace: ro (nothing: $HOME gets a scratch layer, /tmp is private; docs/sandbox-writes.md) or rw (all the caller may)")
	fs.StringArrayVar(&cfg.allow, "allow", nil, "a path outside the workspace that stagefs run and the agent commands may write for real (repeatable)")
	return fs
}

func runMount(ctx context.Context, args []string) error {
	var cfg mountConfig
	var asJSON bool
	fs := mountFlags("mount", &cfg)
	fs.BoolVar(&asJSON, "json", false, "print where everything is as JSON")
	if err := fs.Parse(args); err != nil {
		return usagef("%v", err)
	}
	if fs.NArg() != 2 {
		return usagef("usage: stagefs mount WORKSPACE MOUNTPOINT [--state DIR] [--mode staged|immediate] [--foreground] [--debug]")
	}
	// A missing mount point is made, as a new user expects; a dead mount
	// left by a killed daemon (ENOTCONN) is cleared by serve instead.
	if _, err := os.Stat(fs.Arg(1)); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(fs.Arg(1), 0o755); err != nil {
			return fmt.Errorf("make the mount point: %w", err)
		}
	}
	if err := cfg.resolve(fs.Arg(0), fs.Arg(1)); err != nil {
		return err
	}
	if cfg.foreground {
		cfg.readyFd = -1
		return serve(ctx, &cfg, nil)
	}
	warnOddMount(&cfg)
	if err := startBackground(&cfg); err != nil {
		return err
	}
	if asJSON {
		return printJSON(map[string]any{"mount": cfg.mountpoint, "workspace": cfg.workspace, "state": cfg.state,
			"socket": socketPath(cfg.state), "mode": cfg.mode, "recovered": cfg.recovered,
			"sandbox": control.Sandbox{Outside: cfg.outside, Allow: nonNil(cfg.allow)}})
	}
	printMounted(os.Stdout, &cfg)
	return nil
}

// printRecovered says what the daemon found from an earlier run.
func printRecovered(w io.Writer, r recovery) {
	if r.Pending > 0 {
		fmt.Fprintf(w, "  pending:   %d change(s), %s, kept from before (stagefs status)\n", r.Pending, humanBytes(r.PendingBytes))
	}
	if c := r.Commit; c != nil {
		fmt.Fprintf(w, "  recovered: an interrupted commit, finished now: %d committed, %d conflict(s), %d failed (stagefs log)\n", c.Committed, c.Conflicts, c.Failed)
	}
	if r.OpenSnapshots > 0 {
		fmt.Fprintf(w, "  open:      %d tool call snapshot(s) left open (stagefs snapshots; stagefs close ID)\n", r.OpenSnapshots)
	}
	if r.TornJournalBytes > 0 {
		fmt.Fprintf(w, "  journal:   cut a torn tail of %d bytes, never acknowledged (see daemon.log)\n", r.TornJournalBytes)
	}
}

// warnOddMount says on stderr what a user may not mean: a mount point
// that holds files (the mount hides them), and a workspace another daemon
// serves already with another state dir (two pending sets over one
// workspace, each unaware of the other's).
func warnOddMount(cfg *mountConfig) {
	if _, mounted := isMounted(cfg.mountpoint); mounted {
		return // refused later, with its own message
	}
	if ents, err := os.ReadDir(cfg.mountpoint); err == nil && len(ents) > 0 {
		fmt.Fprintf(os.Stderr, "stagefs: warning: the mount point %s is not empty; the mount hides its %d entr(ies) until unmounted\n", cfg.mountpoint, len(ents))
	}
	ms, _ := readMounts()
	for _, m := range ms {
		state, ok := strings.CutPrefix(m.source, stagefsSourcePrefix)
		if !ok || state == cfg.state {
			continue
		}
		c, err := control.Dial(socketPath(state))
		if err != nil {
			continue
		}
		ictx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		init, err := c.Initialize(ictx)
		cancel()
		c.Close()
		if err == nil && init.Workspace == cfg.workspace {
			fmt.Fprintf(os.Stderr, "stagefs: warning: %s is already served at %s with another state dir (%s); the two pending sets do not know of each other\n", cfg.workspace, init.Mount, state)
		}
	}
}

// resolve makes the paths absolute and real, picks the state dir and
// refuses layouts that would make the mount see itself.
func (cfg *mountConfig) resolve(workspace, mountpoint string) error {
	var err error
	if cfg.workspace, err = realDir(workspace, "workspace"); err != nil {
		return err
	}
	if cfg.mountpoint, err = realDir(mountpoint, "mount point"); err != nil {
		return err
	}
	if _, err := overlay.ParseMode(cfg.mode); err != nil {
		return usagef("%v", err)
	}
	if cfg.journalSync < 0 || cfg.journalSync > time.Minute {
		return usagef("--journal-sync must be between 0 and 1m, not %v", cfg.journalSync)
	}
	if cfg.transport != transportDev && cfg.transport != transportURing {
		return usagef("--fuse-transport must be %s or %s, not %q", transportDev, transportURing, cfg.transport)
	}
	if cfg.captureFailure != "allow" && cfg.captureFailure != "deny" {
		return usagef("--capture-failure must be allow or deny, not %q", cfg.captureFailure)
	}
	for flag, globs := range map[string][]string{"--deny": cfg.deny, "--hide": cfg.hide, "--no-capture": cfg.noCapture} {
		for _, g := range globs {
			if err := overlay.CheckGlob(g); err != nil {
				return usagef("%s: %v", flag, err)
			}
		}
	}
	if cfg.timeout < 0 || cfg.maxTurns < 0 || cfg.maxTurnAge < 0 || cfg.snapshotCap < 0 {
		return usagef("--cache-timeout, --max-turns, --max-turn-age and --snapshot-cap cannot be negative")
	}
	if within(cfg.mountpoint, cfg.workspace) {
		return fmt.Errorf("the mount point %s is inside the workspace %s: the mount would contain itself; choose a mount point outside the workspace", cfg.mountpoint, cfg.workspace)
	}
	if within(cfg.workspace, cfg.mountpoint) {
		return fmt.Errorf("the workspace %s is inside the mount point %s: it would be hidden by the mount; choose another mount point", cfg.workspace, cfg.mountpoint)
	}
	if cfg.state == "" {
		cfg.state, err = defaultStateDir(cfg.workspace)
		if err != nil {
			return err
		}
	}
	if cfg.state, err = filepath.Abs(cfg.state); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.state, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	if real, err := filepath.EvalSymlinks(cfg.state); err == nil {
		cfg.state = real
	}
	if within(cfg.state, cfg.mountpoint) {
		return fmt.Errorf("the state dir %s is inside the mount point %s: it would be reachable through the mount; choose a state dir elsewhere with --state", cfg.state, cfg.mountpoint)
	}
	if within(cfg.workspace, cfg.state) {
		return fmt.Errorf("the workspace %s is inside the state dir %s; choose another state dir", cfg.workspace, cfg.state)
	}
	if len(socketPath(cfg.state)) > 107 {
		return fmt.Errorf("the control socket path %s is longer than a Unix socket allows (107 bytes); choose a shorter --state", socketPath(cfg.state))
	}
	return cfg.resolveSandbox()
}

// resolveSandbox checks --outside and makes each --allow path real and
// absolute, once, here: the daemon records them, and every run of the
// mount binds them as they were named now.
func (cfg *mountConfig) resolveSandbox() error {
	if cfg.outside != sandbox.OutsideReadOnly && cfg.outside != sandbox.OutsideWritable {
		return usagef("--outside must be ro or rw, not %q", cfg.outside)
	}
	if cfg.outside == sandbox.OutsideWritable && len(cfg.allow) > 0 {
		return usagef("--allow has no use with --outside rw, which lets commands write everywhere the caller may")
	}
	var allow []string
	for _, p := range cfg.allow {
		abs, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		real, err := filepath.EvalSymlinks(abs)
		if err != nil {
			return fmt.Errorf("--allow %s: %w", p, err)
		}
		switch {
		case real == "/":
			return usagef("--allow /: to let commands write everywhere, mount with --outside rw")
		case within(real, cfg.workspace):
			return usagef("--allow %s: it is in the workspace, where every write is staged", p)
		case within(real, cfg.mountpoint):
			return usagef("--allow %s: it is in the mount, which commands write through the workspace's path", p)
		case within(real, cfg.state):
			return usagef("--allow %s: it is in the state dir, which the sandbox hides", p)
		}
		if !slices.Contains(allow, real) {
			allow = append(allow, real)
		}
	}
	cfg.allow = allow
	return nil
}

func realDir(p, what string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		if errors.Is(err, syscall.ENOTCONN) {
			// A dead mount left by a killed daemon: serve clears it.
			return abs, nil
		}
		return "", fmt.Errorf("%s %s: %w", what, p, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, p, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s %s is not a directory", what, p)
	}
	return real, nil
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func defaultStateDir(workspace string) (string, error) {
	root := os.Getenv("XDG_STATE_HOME")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no $XDG_STATE_HOME and no home directory: pass --state DIR")
		}
		root = filepath.Join(home, ".local", "state")
	}
	sum := sha256.Sum256([]byte(workspace))
	return filepath.Join(root, "stagefs", filepath.Base(workspace)+"-"+hex.EncodeToString(sum[:])[:12]), nil
}

func socketPath(state string) string { return filepath.Join(state, "control.sock") }

// nonNil gives a nil list as an empty one, which JSON shows as [], not
// null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// startBackground re-runs stagefs as a detached daemon and waits until it
// reports the mount ready (or why it failed).
func startBackground(cfg *mountConfig) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	logPath := filepath.Join(cfg.state, "daemon.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		w.Close()
		return err
	}
	defer logf.Close()
	dargs := []string{daemonCommand, "--ready-fd", "3", "--state", cfg.state, "--mode", cfg.mode,
		"--cache-timeout", cfg.timeout.String(), "--snapshot-cap", strconv.FormatInt(cfg.snapshotCap, 10),
		"--max-turns", strconv.Itoa(cfg.maxTurns), "--max-turn-age", cfg.maxTurnAge.String()}
	for _, g := range cfg.noCapture {
		dargs = append(dargs, "--no-capture", g)
	}
	dargs = append(dargs, "--capture-failure", cfg.captureFailure, "--journal-sync", cfg.journalSync.String())
	for _, g := range cfg.deny {
		dargs = append(dargs, "--deny", g)
	}
	for _, g := range cfg.hide {
		dargs = append(dargs, "--hide", g)
	}
	dargs = append(dargs, "--outside", cfg.outside)
	for _, p := range cfg.allow {
		dargs = append(dargs, "--allow", p)
	}
	if cfg.debug {
		dargs = append(dargs, "--debug")
	}
	if cfg.noPassthrough {
		dargs = append(dargs, "--no-passthrough")
	}
	dargs = append(dargs, "--fuse-transport", cfg.transport)
	dargs = append(dargs, cfg.workspace, cfg.mountpoint)
	cmd := exec.Command(exe, dargs...)
	cmd.Dir = "/" // never inside the mount
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	if rest, ok := strings.CutPrefix(line, "ready "); ok {
		json.Unmarshal([]byte(rest), &cfg.recovered)
		line = "ready"
	}
	if line != "ready" {
		cmd.Wait()
		if line == "" {
			line = "the daemon exited before the mount was ready; see " + logPath
		}
		return errors.New(strings.TrimPrefix(line, "error: "))
	}
	cmd.Process.Release()
	return nil
}

// printMounted tells the user where everything is.
func printMounted(w io.Writer, cfg *mountConfig) {
	fmt.Fprintf(w, "mounted %s\n  workspace: %s\n  state dir: %s\n  socket:    %s\n  mode:      %s\n",
		cfg.mountpoint, cfg.workspace, cfg.state, socketPath(cfg.state), cfg.mode)
	if cfg.outside == sandbox.OutsideWritable {
		fmt.Fprintf(w, "  outside:   writable by stagefs run and the agents (--outside rw)\n")
	} else {
		fmt.Fprintf(w, "  outside:   read-only to stagefs run and the agents; $HOME has a scratch layer (stagefs scratch)\n")
	}
	for _, p := range cfg.allow {
		fmt.Fprintf(w, "  allowed:   %s\n", p)
	}
	printRecovered(w, cfg.recovered)
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"stagefs/control"
)

// clientFlags are the flags every client command takes.
type clientFlags struct {
	mount, socket string
	json          bool
}

func newClientFlags(name string) (*pflag.FlagSet, *clientFlags) {
	cf := &clientFlags{}
	fs := newFlagSet(name)
	fs.StringVarP(&cf.mount, "mount", "m", "", "the stagefs mount point to talk to")
	fs.StringVar(&cf.socket, "socket", "", "the daemon's control socket")
	fs.BoolVar(&cf.json, "json", false, "print the result as JSON")
	return fs, cf
}

// findSocket picks the control socket: --socket, then -m, then
// $STAGEFS_SOCKET, then the stagefs mount holding the current directory.
func (cf *clientFlags) findSocket() (string, error) {
	if cf.socket != "" {
		return cf.socket, nil
	}
	if cf.mount != "" {
		mp, err := filepath.Abs(cf.mount)
		if err != nil {
			return "", err
		}
		if real, err := filepath.EvalSymlinks(mp); err == nil {
			mp = real
		}
		m, ok := isMounted(mp)
		if !ok || !strings.HasPrefix(m.source, stagefsSourcePrefix) {
			return "", &noDaemonError{fmt.Errorf("%s is not a stagefs mount", cf.mount)}
		}
		return socketPath(strings.TrimPrefix(m.source, stagefsSourcePrefix)), nil
	}
	if s := os.Getenv("STAGEFS_SOCKET"); s != "" {
		return s, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	ms, _ := readMounts()
	best := ""
	for _, m := range ms {
		if strings.HasPrefix(m.source, stagefsSourcePrefix) && within(wd, m.point) && len(m.point) > len(best) {
			best = m.point
			cf.socket = socketPath(strings.TrimPrefix(m.source, stagefsSourcePrefix))
		}
	}
	if best == "" {
		return "", &noDaemonError{fmt.Errorf("no stagefs mount holds %s: pass -m MOUNTPOINT, --socket PATH or set STAGEFS_SOCKET", wd)}
	}
	return cf.socket, nil
}

// dial connects to the daemon: -m, --socket, $STAGEFS_SOCKET, the mount
// holding the current directory, or the daemon whose workspace holds it
// (clients are as often run from the workspace as from the mount).
func (cf *clientFlags) dial() (*control.Client, error) {
	sock, err := cf.findSocket()
	if err != nil {
		var nd *noDaemonError
		if !errors.As(err, &nd) || cf.mount != "" || cf.socket != "" || os.Getenv("STAGEFS_SOCKET") != "" {
			return nil, err
		}
		wd, werr := os.Getwd()
		if werr != nil {
			return nil, err
		}
		if c, _ := daemonForWorkspacePath(context.Background(), wd); c != nil {
			return c, nil
		}
		return nil, &noDaemonError{fmt.Errorf("no stagefs mount or mounted workspace holds %s: pass -m MOUNTPOINT, --socket PATH or set STAGEFS_SOCKET (or mount it: stagefs mount WORKSPACE MOUNTPOINT)", wd)}
	}
	c, err := control.Dial(sock)
	if err != nil {
		return nil, &noDaemonError{fmt.Errorf("%w; if the daemon was killed or the machine restarted, mount again (stagefs mount WORKSPACE MOUNTPOINT): nothing staged is lost", err)}
	}
	return c, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func parseClient(name string, args []string, extra func(*pflag.FlagSet)) (*clientFlags, []string, *control.Client, error) {
	fs, cf := newClientFlags(name)
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, nil, usagef("%s: %v", name, err)
	}
	c, err := cf.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	return cf, fs.Args(), c, nil
}

func runStatus(ctx context.Context, args []string) error {
	cf, paths, c, err := parseClient("status", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	res, err := c.Status(ctx, paths)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	if len(res.Policy.Deny)+len(res.Policy.Hide) > 0 {
		fmt.Printf("policy: deny %v, hide %v\n", res.Policy.Deny, res.Policy.Hide)
	}
	if sb := res.Sandbox; sb != nil && sb.Scratch != nil && sb.Scratch.Entries > 0 {
		fmt.Printf("scratch layer: %d path(s), %s under $HOME, /tmp and /var/tmp, kept out of the real ones (stagefs scratch)\n", sb.Scratch.Entries, humanBytes(sb.Scratch.Bytes))
	}
	if res.PendingCount == 0 {
		fmt.Printf("nothing pending (mode %s)\n", res.Mode)
		return nil
	}
	fmt.Printf("%d pending change(s), %s, oldest %s ago (mode %s)\n", res.PendingCount, humanBytes(res.TotalBytes),
		(time.Duration(res.OldestPendingAgeMs) * time.Millisecond).Round(time.Second), res.Mode)
	for _, e := range res.Entries {
		what := e.Path
		if e.From != "" {
			what = e.From + " -> " + e.Path
		}
		who := ""
		if e.PID != 0 {
			who = fmt.Sprintf("  (%s[%d])", e.Comm, e.PID)
		}
		fmt.Printf("  %-9s %s  %s  %s%s\n", e.Kind, what, humanBytes(e.Bytes), shortAge(e.AgeMs), who)
	}
	return nil
}

// shortAge writes how long ago a change was staged in one unit, rounded
// down, so the column stays short: 45s, 3m, 2h, 5d.
func shortAge(ms int64) string {
	d := time.Duration(max(ms, 0)) * time.Millisecond
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", d/time.Second)
	case d < time.Hour:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return fmt.Sprintf("%dd", d/(24*time.Hour))
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// colorFlag is the value of diff's --color. Checking it in Set makes a bad
// value a flag parse error, which parseClient reports as a usage error
// before it tries to reach the daemon.
type colorFlag string

func (c *colorFlag) String() string { return string(*c) }
func (c *colorFlag) Type() string   { return "auto|always|never" }

func (c *colorFlag) Set(v string) error {
	switch v {
	case "auto", "always", "never":
		*c = colorFlag(v)
		return nil
	}
	return fmt.Errorf("want auto, always or never")
}

func runDiff(ctx context.Context, args []string) error {
	color := colorFlag("auto")
	cf, paths, c, err := parseClient("diff", args, func(fs *pflag.FlagSet) {
		fs.Var(&color, "color", "color the diff: auto (on a terminal), always or never")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	res, err := c.Diff(ctx, paths)
	if err != nil {
		return err
	}
	warnOmittedBinaries(res.Diff)
	if cf.json {
		return printJSON(res)
	}
	useColor := color == "always" || (color == "auto" && isTerminal(os.Stdout))
	if !useColor {
		_, err = io.WriteString(os.Stdout, res.Diff)
		return err
	}
	for _, line := range strings.SplitAfter(res.Diff, "\n") {
		switch {
		case strings.HasPrefix(line, "+++"), strings.HasPrefix(line, "---"), strings.HasPrefix(line, "diff "):
			fmt.Print("\x1b[1m" + strings.TrimSuffix(line, "\n") + "\x1b[0m\n")
		case strings.HasPrefix(line, "+"):
			fmt.Print("\x1b[32m" + strings.TrimSuffix(line, "\n") + "\x1b[0m\n")
		case strings.HasPrefix(line, "-"):
			fmt.Print("\x1b[31m" + strings.TrimSuffix(line, "\n") + "\x1b[0m\n")
		case strings.HasPrefix(line, "@@"):
			fmt.Print("\x1b[36m" + strings.TrimSuffix(line, "\n") + "\x1b[0m\n")
		default:
			fmt.Print(line)
		}
	}
	return nil
}

// isTerminal reports whether f is a terminal. Being a character device is
// not enough (/dev/null is one, and "stagefs diff >/dev/null" must not
// color); only a terminal answers the TCGETS ioctl.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func runCommit(ctx context.Context, args []string) error {
	var force bool
	cf, paths, c, err := parseClient("commit", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&force, "force", false, "overwrite workspace changes made since staging")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	stop := watchProgress(c, cf)
	res, err := c.Commit(ctx, control.CommitParams{Paths: paths, Force: force})
	stop()
	var ce *control.Error
	if err != nil && !errors.As(err, &ce) {
		// The connection broke: the daemon stopped mid-commit. The commit
		// is all-or-nothing across that; the next mount finishes it and
		// says so.
		return fmt.Errorf("%w; the daemon stopped before answering: a commit it had begun is finished when the workspace is mounted again (stagefs mount prints what it recovered, stagefs log has the record)", err)
	}
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		for _, p := range res.Committed {
			fmt.Printf("committed  %s\n", p)
		}
		for _, x := range res.Conflicts {
			fmt.Printf("conflict   %s: %s%s\n", x.Path, x.Reason, conflictStates("staged against", "workspace now", x))
			if x.WorkspaceHash != "" || x.StagedHash != "" {
				fmt.Printf("           workspace %s, staged %s\n", orNone(x.WorkspaceHash), orNone(x.StagedHash))
			}
		}
		for _, f := range res.Failed {
			fmt.Printf("failed     %s: %s\n", f.Path, f.Reason)
		}
		if len(res.Committed)+len(res.Conflicts)+len(res.Failed) == 0 {
			fmt.Println("nothing to commit")
		}
	}
	if n := len(res.Conflicts) + len(res.Failed); n > 0 {
		return &conflictError{fmt.Sprintf("%d path(s) not committed; they stay pending (use --force to overwrite conflicts)", n)}
	}
	return nil
}

func runDiscard(ctx context.Context, args []string) error {
	cf, paths, c, err := parseClient("discard", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	stop := watchProgress(c, cf)
	res, err := c.Discard(ctx, paths)
	stop()
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	for _, p := range res.Discarded {
		fmt.Printf("discarded  %s\n", p)
	}
	if len(res.Discarded) == 0 {
		fmt.Println("nothing to discard")
	}
	return nil
}

func runMode(ctx context.Context, args []string) error {
	cf, rest, c, err := parseClient("mode", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) > 1 || (len(rest) == 1 && rest[0] != "staged" && rest[0] != "immediate") {
		return usagef("usage: stagefs mode [staged|immediate]")
	}
	if len(rest) == 0 {
		res, err := c.Initialize(ctx)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(map[string]string{"mode": res.Mode})
		}
		fmt.Println(res.Mode)
		return nil
	}
	res, err := c.SetMode(ctx, rest[0])
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	fmt.Printf("mode %s (was %s)\n", res.Mode, res.Previous)
	return nil
}

func runLog(ctx context.Context, args []string) error {
	var since uint64
	var limit, tail int
	cf, paths, c, err := parseClient("log", args, func(fs *pflag.FlagSet) {
		fs.Uint64Var(&since, "since", 0, "only records after this sequence number")
		fs.IntVar(&limit, "limit", 0, "at most N records, oldest first: page forward with --since the last seq shown")
		fs.IntVar(&tail, "tail", 0, "only the newest N records")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	res, err := c.Log(ctx, control.LogParams{Since: since, Paths: paths, Limit: limit, Tail: tail})
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	for _, r := range res.Records {
		what := r.Path
		if r.Path2 != "" {
			what += " -> " + r.Path2
		}
		extra := ""
		if r.Size != 0 {
			extra += fmt.Sprintf(" size=%d", r.Size)
		}
		if r.Detail != "" {
			extra += " " + r.Detail
		}
		who := ""
		if r.PID != 0 {
			who = fmt.Sprintf(" %s[%d]", r.Comm, r.PID)
		}
		fmt.Printf("%6d %s %-12s %s%s%s\n", r.Seq, r.Time, r.Op, what, extra, who)
	}
	return nil
}

func runEvents(ctx context.Context, args []string) error {
	cf, _, c, err := parseClient("events", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	ch, err := c.Subscribe(ctx)
	if err != nil {
		return err
	}
	for ev := range ch {
		if cf.json {
			b, _ := json.Marshal(ev)
			fmt.Println(string(b))
			continue
		}
		parts := []string{ev.Time, ev.Kind}
		if ev.Kind == control.EventStagedWritesPending {
			parts = append(parts, fmt.Sprintf("pending=%d bytes=%d", ev.PendingCount, ev.TotalBytes))
		}
		if len(ev.Paths) > 0 {
			ps := append([]string(nil), ev.Paths...)
			sort.Strings(ps)
			parts = append(parts, strings.Join(ps, " "))
		}
		if ev.Missed > 0 {
			parts = append(parts, fmt.Sprintf("missed=%d", ev.Missed))
		}
		fmt.Println(strings.Join(parts, " "))
	}
	return nil
}

func runRead(ctx context.Context, args []string) error {
	cf, rest, c, err := parseClient("read", args, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 {
		return usagef("usage: stagefs read PATH")
	}
	here, err := fromHere(ctx, c, rest[:1])
	if err != nil {
		return err
	}
	res, err := c.ReadText(ctx, here[0])
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(res)
	}
	if !res.Exists {
		return fmt.Errorf("%s does not exist in the mount", rest[0])
	}
	fmt.Fprintf(os.Stderr, "%s  %d bytes\n", res.SHA256, res.Size)
	_, err = io.WriteString(os.Stdout, res.Content)
	return err
}

func runPatch(ctx context.Context, args []string) error {
	var expect, contentFile string
	var edits []string
	cf, rest, c, err := parseClient("patch", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&expect, "expect", "", "sha256 of the current content, as stagefs read prints it; \"none\": the file must not exist (required)")
		fs.StringVar(&contentFile, "content-file", "", "new content from this file (default: stdin)")
		fs.StringArrayVar(&edits, "edit", nil, "OLD=NEW replacement; OLD must occur exactly once (repeatable)")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if len(rest) != 1 || (contentFile != "" && len(edits) > 0) || expect == "" {
		return usagef("usage: stagefs patch PATH --expect HASH|none [--content-file FILE | --edit OLD=NEW...] (new content on stdin by default)")
	}
	if expect == "none" {
		expect = ""
	}
	if contentFile == "" && len(edits) == 0 {
		contentFile = "-"
	}
	p := control.SafeTextPatchParams{Path: rest[0], ExpectedHash: expect}
	if contentFile != "" {
		var data []byte
		if contentFile == "-" {
			data, err = io.ReadAll(os.Stdin)
		} else {
			data, err = os.ReadFile(contentFile)
		}
		if err != nil {
			return err
		}
		s := string(data)
		p.Content = &s
	}
	for _, e := range edits {
		old, nw, ok := strings.Cut(e, "=")
		if !ok {
			return usagef("--edit wants OLD=NEW, got %q", e)
		}
		p.Edits = append(p.Edits, control.TextEdit{OldText: old, NewText: nw})
	}
	here, err := fromHere(ctx, c, []string{p.Path})
	if err != nil {
		return err
	}
	p.Path = here[0]
	res, err := c.SafeTextPatch(ctx, p)
	if err != nil {
		return err
	}
	if cf.json {
		if err := printJSON(res); err != nil {
			return err
		}
	} else {
		fmt.Printf("%s %s sha256 %s\n", res.Result, rest[0], res.SHA256)
	}
	if res.Result == control.PatchStaleBase {
		return &conflictError{"the file changed since the expected hash was taken (stale_base)"}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// fromHere makes the relative PATH arguments of a client command relative
// to the current directory, as git does, when that directory is inside the
// mount or the workspace: `stagefs status print.go` in mnt/src/fmt means
// src/fmt/print.go. Elsewhere they stay relative to the workspace's root.
// Absolute paths go as they are; the daemon maps those under the mount or
// the workspace.
func fromHere(ctx context.Context, c *control.Client, paths []string) ([]string, error) {
	relative := false
	for _, p := range paths {
		relative = relative || !filepath.IsAbs(p)
	}
	if !relative {
		return paths, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return paths, nil
	}
	if real, err := filepath.EvalSymlinks(wd); err == nil {
		wd = real
	}
	init, err := c.Initialize(ctx)
	if err != nil {
		return nil, err
	}
	if !within(wd, init.Mount) && !within(wd, init.Workspace) {
		return paths, nil
	}
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = p
		if !filepath.IsAbs(p) {
			out[i] = filepath.Join(wd, p)
		}
	}
	return out, nil
}

// conflictStates says, when known, what a path was expected to be and
// what it is: " (LEFT x, NOW y)", or "" when neither is known.
func conflictStates(left, now string, x control.Conflict) string {
	var parts []string
	if x.Expected != "" {
		parts = append(parts, left+" "+x.Expected)
	}
	if x.Actual != "" {
		parts = append(parts, now+" "+x.Actual)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// warnOmittedBinaries says on stderr which binary changes the diff shows
// only as "Binary files ... differ" (a side over 1 MiB): git apply refuses
// those, and a user piping the diff to it should know before.
func warnOmittedBinaries(diff string) {
	var paths []string
	for _, line := range strings.Split(diff, "\n") {
		// "Binary files a/P and b/P differ", /dev/null for a side that
		// does not exist.
		rest, ok := strings.CutPrefix(line, "Binary files ")
		if !ok || !strings.HasSuffix(rest, " differ") {
			continue
		}
		from, to, _ := strings.Cut(strings.TrimSuffix(rest, " differ"), " and ")
		if p, ok := strings.CutPrefix(to, "b/"); ok {
			paths = append(paths, p)
		} else if p, ok := strings.CutPrefix(from, "a/"); ok {
			paths = append(paths, p)
		}
	}
	if len(paths) > 0 {
		fmt.Fprintf(os.Stderr, "stagefs: the diff leaves out %d binary change(s) over 1 MiB, which git apply will refuse: %s; apply the rest with git apply --exclude=PATH, and commit these with stagefs commit PATH\n", len(paths), strings.Join(paths, ", "))
	}
}

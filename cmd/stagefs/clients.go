package main

// What the client subcommands share: finding and dialing the daemon,
// parsing the common flags, making PATH arguments relative to where the
// command runs, and printing.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"stagefs/control"
)

// clientFlags are the flags every client command takes.
type clientFlags struct {
	mount, socket string
	branch        string
	json          bool
}

func newClientFlags(name string) (*pflag.FlagSet, *clientFlags) {
	cf := &clientFlags{}
	fs := newFlagSet(name)
	fs.StringVarP(&cf.mount, "mount", "m", "", "the stagefs mount point to talk to")
	fs.StringVar(&cf.socket, "socket", "", "the daemon's control socket")
	fs.StringVar(&cf.branch, "branch", "", "talk to this branch of the mount (stagefs branches lists them; main: the main view)")
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
	c, err := cf.dialView()
	if err != nil || cf.branch == "" {
		return c, err
	}
	// However the daemon was found, --branch then picks the view.
	return dialBranch(c, cf.branch)
}

// dialView connects to the daemon of the view the flags, the environment
// or the current directory name (the main view, for a workspace path).
func (cf *clientFlags) dialView() (*control.Client, error) {
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

// dialBranch connects to the socket of branch name of the mount c serves
// (any of its views), and closes c.
func dialBranch(c *control.Client, name string) (*control.Client, error) {
	defer c.Close()
	res, err := c.ListBranches(context.Background())
	if err != nil {
		return nil, err
	}
	sock := ""
	if name == control.MainBranch {
		sock = res.MainSocket
	}
	for _, b := range res.Branches {
		if b.Name == name && b.NotServed != "" {
			return nil, fmt.Errorf("branch %s is not served: %s", name, b.NotServed)
		}
		if b.Name == name {
			sock = b.Socket
		}
	}
	if sock == "" {
		var names []string
		for _, b := range res.Branches {
			names = append(names, b.Name)
		}
		return nil, fmt.Errorf("no branch %q in this mount (branches: %s; make one with stagefs branch %s)", name, strings.Join(append([]string{control.MainBranch}, names...), ", "), name)
	}
	bc, err := control.Dial(sock)
	if err != nil {
		return nil, fmt.Errorf("branch %s: %w", name, err)
	}
	return bc, nil
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

// humanBytes writes a size in binary units, with one decimal.
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

// isTerminal reports whether f is a terminal. Being a character device is
// not enough (/dev/null is one, and "stagefs diff >/dev/null" must not
// color); only a terminal answers the TCGETS ioctl.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
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

// printSnapshot reports a snapshot as snapshot and close print it: its
// scope, id, state, size and paths.
func printSnapshot(verb string, s control.SnapshotInfo) {
	state := "closed"
	if s.Open {
		state = "open"
	}
	fmt.Printf("%s %s (%s, %s, %d path(s), %s)\n", verb, s.ScopeID, s.SnapshotID, state, len(s.Paths), humanBytes(s.Bytes))
	for _, p := range s.Paths {
		fmt.Printf("  %s\n", shown(p))
	}
}

// scopeCommand parses the command line of a client command whose one
// argument is a scope id (close, drop) and dials the daemon.
func scopeCommand(name string, args []string) (*clientFlags, string, *control.Client, error) {
	cf, rest, c, err := parseClient(name, args, nil)
	if err != nil {
		return nil, "", nil, err
	}
	if len(rest) != 1 {
		c.Close()
		return nil, "", nil, usagef("usage: stagefs %s SCOPE", name)
	}
	return cf, rest[0], c, nil
}

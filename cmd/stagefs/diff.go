package main

// stagefs diff [PATH...]: the pending changes as a unified diff that git
// apply takes (fs/diff); with --branch NAME, what the branch changed since
// its fork point (branch/diff).

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"stagefs/control"
)

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
	var against string
	cf, paths, c, err := parseClient("diff", args, func(fs *pflag.FlagSet) {
		fs.Var(&color, "color", "color the diff: auto (on a terminal), always or never")
		fs.StringVar(&against, "against", "", "with --branch: diff against the branch's parent now (what a merge would write), not its fork point")
	})
	if err != nil {
		return err
	}
	defer c.Close()
	paths, err = fromHere(ctx, c, paths)
	if err != nil {
		return err
	}
	var res control.DiffResult
	if cf.branch != "" && cf.branch != control.MainBranch {
		res, err = c.BranchDiff(ctx, control.BranchDiffParams{Name: cf.branch, Against: against, Paths: paths})
	} else if against != "" {
		return usagef("diff: --against goes with --branch NAME")
	} else {
		res, err = c.Diff(ctx, paths)
	}
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

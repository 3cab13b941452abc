package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// examples shows one typical use of each command in its --help.
var examples = map[string]string{
	"mount":       "stagefs mount ~/project /tmp/project-staged --deny '.git/hooks/**' --hide .env",
	"unmount":     "stagefs unmount /tmp/project-staged",
	"status":      "cd /tmp/project-staged/src && stagefs status main.go",
	"diff":        "stagefs diff -m /tmp/project-staged | git -C ~/project apply --check",
	"commit":      "stagefs commit src/main.go README.md",
	"discard":     "stagefs discard build/",
	"mode":        "stagefs mode immediate",
	"log":         "stagefs log --since 120 --limit 50 --json",
	"events":      "stagefs events --json",
	"read":        "stagefs read src/main.go > /tmp/main.go.staged",
	"patch":       "stagefs patch src/main.go --expect SHA256 --edit 'old text=new text'",
	"snapshot":    "stagefs snapshot tc1 --label 'Bash: make'",
	"close":       "stagefs close tc1",
	"restore":     "stagefs restore tc1",
	"snapshots":   "stagefs snapshots",
	"drop":        "stagefs drop tc1",
	"exec":        "stagefs exec --scope tc1 -C /tmp/project-staged -- make test",
	"turn":        "stagefs turn --label 'fix the build'",
	"checkpoints": "stagefs checkpoints",
	"rollback":    "stagefs rollback t3 --diff",
	"redo":        "stagefs redo",
	"user":        "stagefs user $$",
	"run":         "cd ~/project && stagefs run --scope tc1 -- sed -i s/foo/bar/ src/*.c",
	"claude":      "cd ~/project && stagefs claude -- -p 'fix the failing test'",
	"codex":       "cd ~/project && stagefs codex -- exec 'fix the failing test'",
	"gemini":      "cd ~/project && stagefs gemini -- -p 'fix the failing test' --yolo",
	"acp":         "stagefs acp -- claude-agent-acp   (as an editor's agent command)",
	"branch":      "stagefs branch try-a && stagefs run --branch try-a -- make test",
	"branches":    "stagefs branches --json",
	"merge":       "stagefs merge try-a src/",
	"hook":        "echo '{\"hook_event_name\":\"Stop\"}' | stagefs hook claude",
	"scratch":     "stagefs scratch -m /tmp/project-staged; stagefs scratch --drop",
}

// helpShown is set when a command printed its help because it was asked
// to (-h, --help): the command then exits 0.
var helpShown bool

// newFlagSet makes a command's flag set whose -h/--help prints the
// command's help on standard output.
func newFlagSet(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = func() {
		helpShown = true
		printCommandHelp(os.Stdout, name, fs)
	}
	return fs
}

// printCommandHelp prints a command's synopsis, what it does, its flags and
// an example.
func printCommandHelp(w io.Writer, name string, fs *pflag.FlagSet) {
	for _, c := range commands {
		if c.name != name {
			continue
		}
		synopsis, about, _ := strings.Cut(c.summary, ": ")
		fmt.Fprintf(w, "usage: stagefs %s\n\n%s.\n", synopsis, strings.ToUpper(about[:1])+about[1:])
	}
	if fs != nil && fs.HasFlags() {
		fmt.Fprintf(w, "\nflags:\n%s", fs.FlagUsages())
	}
	if ex := examples[name]; ex != "" {
		fmt.Fprintf(w, "\nexample:\n  %s\n", ex)
	}
	fmt.Fprintf(w, "\nexit status: 0 success, 1 error, 2 usage, 3 conflicts or a stale base, 4 no daemon (docs/cli.md)\n")
}

// wantsHelp reports whether args ask for help before any "--".
func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "-h" || a == "--help" {
			return true
		}
	}
	return false
}

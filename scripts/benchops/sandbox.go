package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"stagefs/control"
)

// measureSandbox times starting a command in `stagefs run`'s sandbox
// against starting it directly, on an empty workspace: what the
// namespaces, the mounts and the dropped capabilities add to every tool
// call. Each figure is the median of reps starts of `true`. A second
// mount with --outside rw gives the same without the confinement outside
// the workspace (issue #22), whose cost is the difference; and one cold
// `go build` in each shows what the scratch layer over $HOME costs a
// build that fills its cache there.
func measureSandbox(bin, root string) {
	base, err := os.MkdirTemp(root, "benchsandbox-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(base)
	ws, mnt := sandboxMount(bin, base, "")
	defer exec.Command(bin, "unmount", "--lazy", mnt).Run()
	wsRW, mntRW := sandboxMount(bin, base, "rw", "--outside", "rw")
	defer exec.Command(bin, "unmount", "--lazy", mntRW).Run()
	start := func(name string, args ...string) func() error {
		return func() error {
			cmd := exec.Command(name, args...)
			cmd.Dir = ws
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%s %v: %v: %s", name, args, err, out)
			}
			return nil
		}
	}
	direct := timed(start("true"))
	run := timed(start(bin, "run", "-m", mnt, "--", "true"))
	runRW := timed(start(bin, "run", "-m", mntRW, "--", "true"))
	scoped := 0
	scope := func() error {
		scoped++
		return start(bin, "run", "-m", mnt, "--scope", fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), scoped), "--", "true")()
	}
	withScope := timed(scope)
	fmt.Printf("%-34s %9s\n", "true, started directly", ms(direct))
	fmt.Printf("%-34s %9s\n", "stagefs run -- true", ms(run))
	fmt.Printf("%-34s %9s\n", "  the same, --outside rw", ms(runRW))
	fmt.Printf("%-34s %9s\n", "  confinement adds", ms(max(run-runRW, 0)))
	fmt.Printf("%-34s %9s\n", "stagefs run --scope ID -- true", ms(withScope))
	measureColdBuild(bin, base, ws, mnt, wsRW, mntRW)
	measureHooks(bin, mnt)
	measureACP(bin, mnt)
}

// sandboxMount mounts a new workspace base/ws+name holding a small Go
// module, with a state dir whose control socket measureHooks finds
// (base/st for the first mount), and returns the workspace and the mount
// point.
func sandboxMount(bin, base, name string, flags ...string) (ws, mnt string) {
	ws, mnt, st := filepath.Join(base, "ws"+name), filepath.Join(base, "mnt"+name), filepath.Join(base, "st"+name)
	for _, d := range []string{ws, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fail(err)
		}
	}
	if err := write(filepath.Join(ws, "go.mod"), "module hello\n\ngo 1.22\n"); err != nil {
		fail(err)
	}
	if err := write(filepath.Join(ws, "main.go"), "package main\n\nfunc main() { println(\"hello\") }\n"); err != nil {
		fail(err)
	}
	args := append([]string{"mount", ws, mnt, "--state", st}, flags...)
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		fail(fmt.Errorf("mount: %v: %s", err, out))
	}
	return ws, mnt
}

// measureColdBuild times `go build` with an empty build cache in the
// confined sandbox, where the cache lands in the scratch layer over
// $HOME, against a run with --outside rw, where it lands in $HOME itself:
// two rounds, alternating, each with a $HOME of its own; the mean of each.
// Skipped without a go command.
func measureColdBuild(bin, base, ws, mnt, wsRW, mntRW string) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		fmt.Printf("%-34s %9s\n", "cold go build (no go command)", "-")
		return
	}
	n := 0
	build := func(ws, mnt string) time.Duration {
		n++
		home := filepath.Join(base, fmt.Sprintf("home%d", n))
		if err := os.MkdirAll(home, 0o755); err != nil {
			fail(err)
		}
		cmd := exec.Command(bin, "run", "-m", mnt, "--", "go", "build", "-o", "hello", ".")
		cmd.Dir = ws
		cmd.Env = append(os.Environ(), "HOME="+home, "PATH="+filepath.Dir(gobin)+":"+os.Getenv("PATH"),
			"GOCACHE=", "GOPATH=", "GOMODCACHE=", "GOFLAGS=", "GOTOOLCHAIN=local", "GOPROXY=off", "XDG_CACHE_HOME=")
		s := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			fail(fmt.Errorf("go build in stagefs run -m %s: %v: %s", mnt, err, out))
		}
		return time.Since(s)
	}
	var confined, open time.Duration
	for i := 0; i < 2; i++ {
		confined += build(ws, mnt)
		open += build(wsRW, mntRW)
	}
	confined, open = confined/2, open/2
	fmt.Printf("%-34s %9s\n", "cold go build, confined", ms(confined))
	fmt.Printf("%-34s %9s\n", "cold go build, --outside rw", ms(open))
	fmt.Printf("%-34s %8.1f%%\n", "  confinement adds", 100*(float64(confined)/float64(open)-1))
}

// measureHooks times what stagefs claude's hooks add to one tool call: the
// hook processes Claude Code starts before and after it (and, for a shell
// command, the bind line it runs first), each a `stagefs hook` talking to
// the hook channel, against the daemon at mnt.
func measureHooks(bin, mnt string) {
	c, err := control.Dial(filepath.Join(filepath.Dir(mnt), "st", "control.sock"))
	if err != nil {
		fail(err)
	}
	init, err := c.Initialize(context.Background())
	c.Close()
	if err != nil {
		fail(err)
	}
	hook := func(payload string) error {
		cmd := exec.Command(bin, "hook", "claude")
		cmd.Env = append(os.Environ(), "STAGEFS_HOOK_SOCKET="+init.HookSocket)
		cmd.Stdin = strings.NewReader(payload)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("stagefs hook claude: %v: %s", err, out)
		}
		return nil
	}
	n := 0
	write := timed(func() error {
		n++
		id := fmt.Sprintf("toolu_bench_w%d_%d", time.Now().UnixNano(), n)
		if err := hook(`{"hook_event_name":"PreToolUse","session_id":"bench","tool_name":"Write","tool_input":{"file_path":"/x"},"tool_use_id":"` + id + `"}`); err != nil {
			return err
		}
		return hook(`{"hook_event_name":"PostToolUse","session_id":"bench","tool_use_id":"` + id + `"}`)
	})
	bash := timed(func() error {
		n++
		id := fmt.Sprintf("toolu_bench_b%d_%d", time.Now().UnixNano(), n)
		if err := hook(`{"hook_event_name":"PreToolUse","session_id":"bench","tool_name":"Bash","tool_input":{"command":"true"},"tool_use_id":"` + id + `"}`); err != nil {
			return err
		}
		// The bind line runs in the command's shell.
		bind := exec.Command("sh", "-c", `"$0" hook bind "$1"`, bin, id)
		bind.Env = append(os.Environ(), "STAGEFS_HOOK_SOCKET="+init.HookSocket)
		if out, err := bind.CombinedOutput(); err != nil {
			return fmt.Errorf("stagefs hook bind: %v: %s", err, out)
		}
		return hook(`{"hook_event_name":"PostToolUse","session_id":"bench","tool_use_id":"` + id + `"}`)
	})
	fmt.Printf("%-34s %9s\n", "hooks of a Write tool call", ms(write))
	fmt.Printf("%-34s %9s\n", "hooks of a Bash tool call (+bind)", ms(bash))
}

// measureACP times what stagefs acp adds: a message relayed to the agent
// and back (the agent is cat, which echoes each line, so every message
// crosses the proxy twice), against the same echo through plain pipes; and
// a tool call's snapshot work, as the echo of a tool_call notification
// and its completed update.
func measureACP(bin, mnt string) {
	rtt := func(name string, args []string, lines func(i int) []string) time.Duration {
		cmd := exec.Command(name, args...)
		in, err := cmd.StdinPipe()
		if err != nil {
			fail(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			fail(err)
		}
		if err := cmd.Start(); err != nil {
			fail(err)
		}
		defer func() { in.Close(); cmd.Wait() }()
		r := bufio.NewReader(out)
		i := 0
		return timedN(51, func() error {
			i++
			for _, l := range lines(i) {
				if _, err := io.WriteString(in, l+"\n"); err != nil {
					return err
				}
				if _, err := r.ReadString('\n'); err != nil {
					return fmt.Errorf("%s: %v", name, err)
				}
			}
			return nil
		})
	}
	ping := func(i int) []string {
		return []string{fmt.Sprintf(`{"jsonrpc":"2.0","method":"bench/ping","params":{"i":%d}}`, i)}
	}
	toolCall := func(i int) []string {
		id := fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i)
		return []string{
			`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"` + id + `","title":"bench","kind":"edit","status":"pending"}}}`,
			`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"` + id + `","status":"completed"}}}`,
		}
	}
	direct := rtt("cat", nil, ping)
	relayed := rtt(bin, []string{"acp", "-m", mnt, "--", "cat"}, ping)
	direct2 := rtt("cat", nil, toolCall)
	snap := rtt(bin, []string{"acp", "-m", mnt, "--", "cat"}, toolCall)
	fmt.Printf("%-34s %9s\n", "acp: a message relayed (each way)", fmt.Sprintf("%dµs", (max(relayed-direct, 0)/2).Microseconds()))
	fmt.Printf("%-34s %9s\n", "acp: a tool call's snapshot work", ms(max(snap-direct2-2*(relayed-direct), 0)))
}

// timedN is timed with n repetitions.
func timedN(n int, fn func() error) time.Duration {
	var ds []time.Duration
	for i := 0; i < n; i++ {
		s := time.Now()
		if err := fn(); err != nil {
			fail(err)
		}
		ds = append(ds, time.Since(s))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

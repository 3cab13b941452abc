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
// call. Each figure is the median of reps starts of `true`.
func measureSandbox(bin, root string) {
	base, err := os.MkdirTemp(root, "benchsandbox-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(base)
	ws, mnt, st := filepath.Join(base, "ws"), filepath.Join(base, "mnt"), filepath.Join(base, "st")
	for _, d := range []string{ws, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			fail(err)
		}
	}
	if out, err := exec.Command(bin, "mount", ws, mnt, "--state", st).CombinedOutput(); err != nil {
		fail(fmt.Errorf("mount: %v: %s", err, out))
	}
	defer exec.Command(bin, "unmount", "--lazy", mnt).Run()
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
	scoped := 0
	scope := func() error {
		scoped++
		return start(bin, "run", "-m", mnt, "--scope", fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), scoped), "--", "true")()
	}
	withScope := timed(scope)
	fmt.Printf("%-34s %9s\n", "true, started directly", ms(direct))
	fmt.Printf("%-34s %9s\n", "stagefs run -- true", ms(run))
	fmt.Printf("%-34s %9s\n", "stagefs run --scope ID -- true", ms(withScope))
	measureHooks(bin, mnt)
	measureACP(bin, mnt)
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

package main

// stagefs hook AGENT: the command an agent's hooks run (wired by stagefs
// claude); stagefs hook bind SCOPE: the line a shell tool call's command
// starts with. Both talk only to the hook channel.

import (
	"context"
	"fmt"
	"io"
	"os"

	"stagefs/agents"
	"stagefs/control"
)

// maxHookPayload bounds what a hook reads from the agent: a tool's whole
// input (a file Write carries) fits many times over.
const maxHookPayload = 64 << 20

func runHook(ctx context.Context, args []string) error {
	if len(args) == 2 && args[0] == "bind" {
		return hookBind(ctx, args[1])
	}
	if len(args) != 1 || args[0] == "-h" || args[0] == "--help" {
		return usagef("usage: stagefs hook AGENT (reads the hook's JSON on stdin) | stagefs hook bind SCOPE\nstagefs claude wires these into the agent; they reach the daemon through $%s", agents.EnvHookSocket)
	}
	a, err := agents.Lookup(args[0])
	if err != nil {
		return usagef("hook: %v", err)
	}
	payload, err := io.ReadAll(io.LimitReader(os.Stdin, maxHookPayload))
	if err != nil {
		return fmt.Errorf("hook: read the payload: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if os.Getenv(agents.EnvNoBind) != "" {
		// stagefs claude --no-bind: shell commands are not rewritten.
		plain := *a
		plain.RewriteInput = nil
		a = &plain
	}
	ans := agents.Hook(a, payload, dialHooks, self, os.Getenv(agents.EnvWorkspace))
	os.Stdout.Write(ans.Stdout)
	if ans.Stderr != "" {
		fmt.Fprintln(os.Stderr, ans.Stderr)
	}
	return &exitStatus{ans.Exit}
}

// hookBind binds the prepared tool call SCOPE to this process's parent:
// the shell about to run the tool call's command.
func hookBind(ctx context.Context, scope string) error {
	c, err := dialHooks()
	if err == nil {
		defer c.Close()
		ctx, cancel := context.WithTimeout(ctx, agents.HookTimeout)
		defer cancel()
		_, err = c.HookToolCallBind(ctx, scope)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "stagefs: tool call %s was not run: its snapshot could not be opened (%v)\n", scope, err)
		return &exitStatus{agents.BindExit}
	}
	return nil
}

func dialHooks() (*control.Client, error) {
	name := os.Getenv(agents.EnvHookSocket)
	if name == "" {
		return nil, fmt.Errorf("$%s is not set: run the agent through stagefs (stagefs claude)", agents.EnvHookSocket)
	}
	return control.DialHooks(name)
}

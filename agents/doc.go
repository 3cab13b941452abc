// Package agents connects coding agents' hooks to stagefs: each prompt
// becomes a turn and each tool call a snapshot, so one tool call can be
// undone and one prompt rolled back, with no change to the agent.
//
// One mechanism serves every agent. An Agent is a small table: which hook
// event starts a turn, starts or ends a tool call, or ends a session;
// which payload fields carry the ids, the prompt, the tool and its input;
// which tools run shell commands, and how the agent lets a hook rewrite a
// tool's input. Handle turns one hook invocation (the event's JSON on
// stdin) into calls on the daemon's hook channel (control/hooks.go) and
// into the answer the agent reads (stdout, stderr, exit status).
//
// Attribution. A tool the agent runs in its own process (Claude Code's
// Write and Edit) is captured by a snapshot that covers every process,
// opened before the tool runs and closed after it. A shell command is
// rewritten, where the agent allows it, to bind its tool call's snapshot
// to the shell that runs it before anything else happens: the snapshot
// then follows that shell's process tree alone, so a command left running
// in the background is still attributed to its own tool call while later
// ones run, and its snapshot closes when the shell exits.
//
// The package talks to the daemon through the control client only.
package agents

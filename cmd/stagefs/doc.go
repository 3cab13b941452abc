// Command stagefs is the CLI and the daemon: flags, wiring and one file
// per subcommand, with no policy of its own.
//
// The daemon (serve.go) opens the journal, the engine (overlay), the
// snapshot store, the FUSE mount (fusefs) and the control socket
// (control), and answers the socket with package backend. Every other
// subcommand is a client of that socket (clients.go holds what they
// share), except run, which enters the sandbox (package sandbox), and
// claude, codex, gemini and acp, which start an agent wired to the daemon
// (packages agents and acp; hook.go and agentcmd.go). docs/cli.md
// describes every command.
package main

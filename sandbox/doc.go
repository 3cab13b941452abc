// Package sandbox runs one command inside the namespace that `stagefs
// run` (and the agent commands built on it) give a tool: the staged view
// at the workspace's own path, the state dir out of reach, and no way back
// out to the real workspace.
//
// The boundary, and how each part of it is made:
//
//   - The workspace path shows the stagefs mount: a private mount
//     namespace in which the mount is bind-mounted over the workspace.
//   - The state dir (pending bodies, journal, control socket) is covered by
//     an empty read-only tmpfs; a state dir under the workspace is already
//     invisible through the mount.
//   - The command sees no process outside its own tree: a PID namespace
//     with a /proc of its own, so no /proc/PID/fd, root, cwd or environ of
//     the daemon or any host process, and nothing to signal or trace.
//   - It cannot lift the mounts that make its view: it runs with no
//     CAP_SYS_ADMIN (nor the other capabilities that reach past the file
//     tree it is given) in any set, with no_new_privs, inside a user
//     namespace where the kernel allows one. Mounts the namespace inherits
//     from the caller's are locked by the kernel, and a nested namespace
//     the command makes cannot unmount any of them. Init (PID 1) keeps its
//     capabilities but is not dumpable, so the command can neither trace
//     it nor reach its memory or descriptors through /proc.
//   - /proc/sys, /proc/sysrq-trigger and /sys are read-only.
//
// Not covered: the network, reading what lies outside the workspace,
// writing outside it (see the README), and the kernel itself.
//
// The parent side (Run) picks the strongest namespace the kernel grants,
// starts this binary's hidden init command in it, and forwards signals.
// The init side (InitMain) is the namespace's PID 1: it sets up the
// mounts, drops the capabilities, starts the command, reaps orphans, and
// exits with the command's status, which ends every process left in the
// namespace.
package sandbox

// Package sandbox runs one command inside the namespace that `stagefs
// run` (and the agent commands and the ACP proxy built on it) give a tool:
// the staged view at the workspace's own path, nothing else on the file
// system writable for real, the state dir out of reach, and no way back
// out to the real workspace.
//
// The boundary, and how each part of it is made:
//
//   - The workspace path shows the stagefs mount: a private mount
//     namespace in which the mount is bind-mounted over the workspace
//     (and over the mount point). Writes there are staged, as anywhere
//     in the mount.
//   - Outside the workspace the file system is read-only (a mount's
//     default, `--outside ro`): every mount in the namespace is made
//     read-only at once (mount_setattr, recursively from /), so a write,
//     create, unlink, rename, chmod or truncate fails with EROFS, also
//     through a symlink in the workspace that points out of it. A few
//     places are then put back on top, writable:
//   - $HOME is the real $HOME under a scratch layer (overlayfs, the real
//     $HOME its read-only lower layer): tools write their caches, history
//     and settings there and find them again in the next run, and the
//     real $HOME never changes. The layer is kept per mount in the state
//     dir (STATE/scratch, see scratch.go), so it survives between runs and
//     restarts; `stagefs scratch` lists and drops it.
//   - /tmp and /var/tmp are directories of the mount's own, also kept in
//     STATE/scratch: shared by its runs, not the host's. /dev works as
//     usual (device nodes are written on a read-only mount too), with
//     /dev/pts writable and a /dev/shm of the namespace's own.
//   - The mount's --allow paths are bound over themselves read-write:
//     writes there are real. With `--outside rw` none of this is done and
//     the command writes outside the workspace as the caller would.
//   - The state dir (pending bodies, journal, control socket) is covered
//     by an empty read-only tmpfs; a state dir under the workspace is
//     already invisible through the mount. Only its scratch layer shows,
//     at $HOME, /tmp and /var/tmp.
//   - The command sees no process outside its own tree: a PID namespace
//     with a /proc of its own, so no /proc/PID/fd, root, cwd or environ of
//     the daemon or any host process, and nothing to signal or trace.
//   - It cannot lift the mounts that make its view: it runs with no
//     CAP_SYS_ADMIN (nor the other capabilities that reach past the file
//     tree it is given) in any set, with no_new_privs, inside a user
//     namespace where the kernel allows one. Mounts the namespace
//     inherits are locked by the kernel, and a nested namespace the
//     command makes can neither unmount nor make writable any mount it
//     inherits. Init (PID 1) keeps its capabilities but is not dumpable,
//     so the command can neither trace it nor reach its memory or
//     descriptors through /proc.
//   - /proc/sys, /proc/sysrq-trigger and /sys are read-only.
//
// Not covered: the network; other processes reached through it or through
// sockets on the file system (a daemon outside may write for the command);
// reading what lies outside the workspace (secrets in $HOME included: a
// mount's --hide keeps files in the workspace from being read, nothing
// hides files outside it); and the kernel itself.
//
// Where a piece of the confinement cannot be made, nothing runs with less
// without a word: a namespace the kernel refuses fails the run with the
// setting that refuses it; a scratch layer overlayfs refuses leaves $HOME
// read-only, with a warning on the command's standard error.
//
// The parent side (Run) reads the mount's settings, picks the strongest
// namespace the kernel grants, starts this binary's hidden init command in
// it, and forwards signals. The init side (InitMain) is the namespace's
// PID 1: it sets up the mounts (confine.go), drops the capabilities,
// starts the command, reaps orphans, and exits with the command's status,
// which ends every process left in the namespace.
package sandbox

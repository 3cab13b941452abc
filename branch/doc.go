// Package branch keeps a mount's branches: forks of its main view (or of
// another branch) with a pending set, journal, snapshots and turns of
// their own, each served by the daemon at a mount point and a control
// socket of its own, so that agents working in parallel never see each
// other's half-done changes.
//
// A branch is made by overlay.Engine.Fork, which takes the fork's instant
// (the paths of the parent's pending set), and ForkCopy.Run, which copies
// them while the parent goes on (a change of the parent first pushes what
// it touches into the copy): the cost is the pending set's, never the
// workspace's. The fork answers at its instant; the branch is registered
// and served once its copy is durable. Its state lives in
// STATE/branches/NAME (NAME/mnt is its mount point);
// STATE/branches/branches.json lists the branches, parents before their
// children.
//
// Each branch keeps an open snapshot of its fork point (overlay.ForkScope):
// it captures the first change of each path by anyone in the branch, so a
// merge knows, path by path, what the branch changed and what the path was
// at the fork. A merge applies to the parent's pending set each path the
// branch changed, unless the parent changed it too since the fork (its
// version now is neither the fork's nor the branch's): that path is a
// conflict, kept in the branch, applied only when forced. A merge is
// journaled in the parent (merge_begin, merge_end) and finished at the
// next start when a crash stops it. After a merge the branch's fork point
// moves to now, keeping the conflicting paths' fork versions.
//
// Lock order: Manager.mu is held through every fork (from its instant
// until the branch is served), drop and merge, and taken before any
// engine lock (a fork's instant holds the parent's change gate under it,
// its copy the parent's Engine.mu; a merge holds the branch's gate whole,
// then takes the parent's).
// Infos, which session/initialize calls on every socket, never waits for
// it.
package branch

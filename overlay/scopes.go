package overlay

import (
	"fmt"
	"strings"
)

// The names of the engine's own snapshots, for the daemon's messages: the
// prefixes are defined once, in turns.go, and InternalScope tells them
// apart from a tool call's.

// TurnScope returns the scope id of a turn's own snapshot.
func TurnScope(turn string) string { return turnPrefix + turn }

// TurnOfScope returns the turn id in a turn's own scope id, and whether
// scope is one.
func TurnOfScope(scope string) (turn string, ok bool) { return strings.CutPrefix(scope, turnPrefix) }

// InternalScopePrefixes returns the scope id prefixes reserved for the
// engine's own snapshots, in the order a message names them.
func InternalScopePrefixes() []string {
	return []string{turnPrefix, postPrefix, redoPrefix, forkPrefix}
}

// ForkScope returns the scope id of a branch's n-th fork point: an open
// snapshot that captures, from that point on, the first change of each
// path by anyone, so a merge knows what the branch changed and what each
// path was at the fork.
func ForkScope(n int) string { return fmt.Sprintf("%s%d", forkPrefix, n) }

// IsForkScope reports whether scope is a branch's fork point.
func IsForkScope(scope string) bool { return strings.HasPrefix(scope, forkPrefix) }

package backend

// What a client sends is checked here before the engine sees it: paths
// become the engine's workspace-relative form or are refused, scope ids
// must be valid and not reserved, labels are made one short line.

import (
	"path/filepath"
	"strings"
	"unicode/utf8"

	"stagefs/control"
	"stagefs/overlay"
	"stagefs/snapshot"
)

// relPath turns a client's path (workspace-relative, or absolute under the
// mount or the workspace) into the engine's form.
func (b *Backend) relPath(p string) (string, error) {
	if p == "" {
		return "", control.Errorf(control.CodeInvalidParams, "empty path")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", control.Errorf(control.CodeInvalidParams, "path contains a NUL byte")
	}
	if !utf8.ValidString(p) || strings.ContainsRune(p, utf8.RuneError) {
		// JSON decoding turns invalid UTF-8 and lone surrogates into
		// U+FFFD: acting on that would touch another name.
		return "", control.Errorf(control.CodeInvalidParams, "path %q is not valid UTF-8", p)
	}
	if filepath.IsAbs(p) {
		c := filepath.Clean(p)
		switch {
		case within(c, b.cfg.Mount):
			p = strings.TrimPrefix(strings.TrimPrefix(c, b.cfg.Mount), "/")
		case within(c, b.cfg.Workspace):
			p = strings.TrimPrefix(strings.TrimPrefix(c, b.cfg.Workspace), "/")
		default:
			return "", control.Errorf(control.CodePathOutsideWorkspace, "%s is outside the workspace %s and the mount %s", p, b.cfg.Workspace, b.cfg.Mount)
		}
		if p == "" {
			p = "."
		}
	}
	rel, err := overlay.CleanPath(p)
	if err != nil {
		return "", control.Errorf(control.CodePathOutsideWorkspace, "%s: %v", p, err)
	}
	return rel, nil
}

// relPathsOrAll is relPaths for the methods where no path means every
// path (status, diff, commit, discard, rollback): the workspace's root
// among them ("." in the mount, or the mount's or the workspace's own
// path) selects everything too, instead of matching nothing.
func (b *Backend) relPathsOrAll(ps []string) ([]string, error) {
	rel, err := b.relPaths(ps)
	if err != nil {
		return nil, err
	}
	for _, r := range rel {
		if r == "" {
			return []string{}, nil
		}
	}
	return rel, nil
}

func (b *Backend) relPaths(ps []string) ([]string, error) {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		r, err := b.relPath(p)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// checkScope refuses a tool call's scope id that the store would refuse,
// or that names one of the engine's own snapshots.
func checkScope(scope string) error {
	if err := snapshot.ValidScope(scope); err != nil {
		return badID(scope, err)
	}
	if overlay.InternalScope(scope) {
		return control.Errorf(control.CodeInvalidParams, "scopeId: the prefixes %s are reserved for turns and branches", andList(overlay.InternalScopePrefixes()))
	}
	return nil
}

// andList writes "a, b and c".
func andList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// checkScopeUnused refuses a scope id that names a closed snapshot: a new
// snapshot would replace it, and its pre-images would be gone with no
// record. (An open one is refused by the store as busy.)
func (b *Backend) checkScopeUnused(scope string) error {
	if info, ok := b.snaps.Lookup(scope); ok && info.Closed {
		return control.Errorf(control.CodeBusy, "scope id %q names an earlier tool call's snapshot; choose a new id, or drop that snapshot first (stagefs drop %s)", scope, scope)
	}
	return nil
}

// maxLabel bounds a snapshot's or turn's label: a person reads it in a
// listing, and a hook may pass a whole prompt or script.
const maxLabel = 120

// shortLabel makes a label one line of at most maxLabel characters.
func shortLabel(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > maxLabel {
		s = string(r[:maxLabel-1]) + "…"
	}
	return s
}

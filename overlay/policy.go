package overlay

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"syscall"
)

// Policies a process in the mount cannot bypass: --deny makes matching
// paths read-only (EACCES, and each refused attempt is journaled), --hide
// makes them invisible (ENOENT). Both apply to every process in the mount,
// never to the daemon's own commit, discard and restore.

// matchGlob reports whether p falls under the glob g. A glob without "/"
// matches any name in the path (node_modules, *.pem); one with "/" matches
// the path or one of its ancestors (.git/config, build/*.o); a trailing
// "/**" matches everything below (.git/hooks/**).
func matchGlob(g, p string) bool {
	g = strings.TrimPrefix(g, "/")
	g = strings.TrimSuffix(g, "/**")
	for q := p; q != ""; q = parentOf(q) {
		if ok, _ := path.Match(g, q); ok {
			return true
		}
		if !strings.Contains(g, "/") {
			_, name := splitPath(q)
			if ok, _ := path.Match(g, name); ok {
				return true
			}
		}
	}
	return false
}

// CheckGlob says why g cannot be a --deny, --hide or --no-capture glob:
// a malformed one ("[" unclosed) would match nothing, and a path the user
// meant to protect would be open.
func CheckGlob(g string) error {
	g = strings.TrimSuffix(strings.TrimPrefix(g, "/"), "/**")
	if g == "" {
		return errors.New("an empty glob matches nothing")
	}
	if _, err := path.Match(g, ""); err != nil {
		return fmt.Errorf("%q is not a glob path.Match accepts: %w", g, err)
	}
	return nil
}

func matchAny(globs []string, p string) bool {
	for _, g := range globs {
		if matchGlob(g, p) {
			return true
		}
	}
	return false
}

// holdsMatch reports whether something matching a glob may lie below the
// directory p, so that renaming or deleting p would reach it.
func holdsMatch(globs []string, p string) bool {
	for _, g := range globs {
		g = strings.TrimPrefix(g, "/")
		if !strings.Contains(g, "/") {
			return true // a name that may appear anywhere below
		}
		lit := g
		if i := strings.IndexAny(g, "*?["); i >= 0 {
			lit = g[:i]
		}
		if strings.HasPrefix(lit, p+"/") || p == "" {
			return true
		}
	}
	return false
}

// checkDeny refuses a mutation of paths by a process in the mount, or by
// the host's own edits (the agent's edit tool), when a --deny glob covers
// one of them, and journals the attempt.
func (e *Engine) checkDeny(c Caller, paths ...string) error {
	if len(e.opts.Deny) == 0 || c.Pid == 0 && !c.Host {
		return nil
	}
	for _, p := range paths {
		if matchAny(e.opts.Deny, p) {
			e.recordLazy(Record{Op: "denied", Path: p, Pid: c.Pid})
			return syscall.EACCES
		}
	}
	return nil
}

// checkDenyTree is checkDeny for a directory that is renamed or removed
// as a whole: a denied path below it would go with it.
func (e *Engine) checkDenyTree(c Caller, dir string) error {
	if len(e.opts.Deny) == 0 || c.Pid == 0 && !c.Host {
		return nil
	}
	if err := e.checkDeny(c, dir); err != nil {
		return err
	}
	if holdsMatch(e.opts.Deny, dir) {
		// Cheap and safe: refuse when a denied path might be below; the
		// tool can still change the entries one by one.
		ents, _ := e.readDirLocked(dir)
		for _, d := range ents {
			q := joinPath(dir, d.Name)
			if matchAny(e.opts.Deny, q) {
				e.recordLazy(Record{Op: "denied", Path: q, Pid: c.Pid})
				return syscall.EACCES
			}
			if d.Mode == syscall.S_IFDIR {
				if err := e.checkDenyTree(c, q); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

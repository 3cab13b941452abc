package overlay

import (
	"errors"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// A commit updates a workspace directory in place (files are written anew
// and renamed over): it sets the xattrs the view shows on it, but it
// cannot tell an xattr removed through the mount from one the user set
// on the workspace's directory after it was staged, since the view shows
// the upper directory's. So a removal through the mount is written down,
// in removedXattrs on the upper directory, and a commit removes exactly
// those.

// removedXattrs lists, NUL-separated, the xattrs removed through the
// mount from a staged directory. It is stagefs's own: never shown, never
// committed as an xattr.
const removedXattrs = xattrPrefix + "rmx"

// noteDirXattr records on the upper directory p that attr was removed
// (removed true) or set again (removed false) through the mount.
func (e *Engine) noteDirXattr(p, attr string, removed bool) error {
	names := e.removedDirXattrs(p)
	i := sort.SearchStrings(names, attr)
	has := i < len(names) && names[i] == attr
	switch {
	case removed && !has:
		names = append(names[:i], append([]string{attr}, names[i:]...)...)
	case !removed && has:
		names = append(names[:i], names[i+1:]...)
	default:
		return nil
	}
	if len(names) == 0 {
		return e.forgetDirXattrs(p)
	}
	return e.upper.setxattr(p, removedXattrs, []byte(strings.Join(names, "\x00")), 0)
}

// removedDirXattrs returns the xattrs removed through the mount from the
// staged directory p, sorted.
func (e *Engine) removedDirXattrs(p string) []string {
	buf := make([]byte, 64<<10)
	n, err := e.upper.getxattr(p, removedXattrs, buf)
	if err != nil || n == 0 {
		return nil
	}
	names := strings.Split(string(buf[:n]), "\x00")
	sort.Strings(names)
	return names
}

// forgetDirXattrs clears the record, once the workspace's directory has
// what the view showed (a commit) or the view shows the workspace's again.
func (e *Engine) forgetDirXattrs(p string) error {
	err := e.upper.removexattr(p, removedXattrs)
	if errors.Is(err, unix.ENODATA) {
		return nil
	}
	return err
}

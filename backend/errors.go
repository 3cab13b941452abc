package backend

// The engine and the snapshot store answer with errnos and sentinels; a
// client gets a protocol error with a code it can act on and a message
// that names what it sent.

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"stagefs/control"
	"stagefs/overlay"
	"stagefs/snapshot"
)

// snapshotError maps the store's errors to protocol errors.
func snapshotError(scope string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		// Say that it is the state dir that is full: the workspace's
		// disk may have room.
		return control.Errorf(control.CodeInvalidState, "the state dir is full (%v): free space there, or mount with --state on a larger disk; stagefs status shows the state dir", err)
	case errors.Is(err, snapshot.ErrNotFound):
		// Turns say what is missing ("no turn t9", "nothing to redo");
		// a missing snapshot is named by its scope.
		detail := strings.TrimPrefix(err.Error(), snapshot.ErrNotFound.Error()+": ")
		if detail == err.Error() || strings.HasPrefix(detail, "snapshot ") {
			detail = fmt.Sprintf("no snapshot for scope %q", scope)
		}
		return control.Errorf(control.CodeNotFound, "%s", detail)
	case errors.Is(err, snapshot.ErrExists):
		return control.Errorf(control.CodeBusy, "a snapshot for scope %q is already open; close it first", scope)
	case errors.Is(err, snapshot.ErrClosed):
		return control.Errorf(control.CodeInvalidState, "the snapshot for scope %q is closed", scope)
	case snapshot.ValidScope(scope) != nil:
		return badID(scope, snapshot.ValidScope(scope))
	}
	return err
}

// turnError maps the errors of a turn's operations (start, rollback) as
// snapshotError does, for the turn's own snapshot.
func turnError(turn string, err error) error {
	return snapshotError(overlay.TurnScope(turn), err)
}

// badID names an id the store refuses as the client gave it: a turn's
// without the prefix its snapshot carries inside.
func badID(scope string, err error) error {
	why := strings.TrimPrefix(err.Error(), "snapshot: ")
	if id, ok := overlay.TurnOfScope(scope); ok {
		why = strings.Replace(strings.Replace(why, "scope id", "turn id", 1), fmt.Sprintf("%q", scope), fmt.Sprintf("%q", id), 1)
		return control.Errorf(control.CodeInvalidParams, "turnId: %s", why)
	}
	return control.Errorf(control.CodeInvalidParams, "scopeId: %s", why)
}

// fileError maps the engine's errors reading or patching one file.
func fileError(path string, err error) error {
	switch {
	case errors.Is(err, syscall.EISDIR):
		return control.Errorf(control.CodeInvalidParams, "%s is not a regular file", path)
	case errors.Is(err, syscall.ELOOP):
		// The engine never follows a symlink for a text method: its
		// target may lie outside the workspace.
		return control.Errorf(control.CodeInvalidParams, "%s is a symbolic link, not a regular file (name its target)", path)
	case errors.Is(err, syscall.EFBIG):
		return control.Errorf(control.CodeInvalidParams, "%s is larger than %d bytes", path, overlay.MaxReadBytes)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENOENT):
		return control.Errorf(control.CodeNotFound, "%s: %v", path, err)
	case errors.Is(err, syscall.EACCES):
		return control.Errorf(control.CodeInvalidState, "%s: permission denied (a --deny policy covers it, or the file's mode)", path)
	}
	return err
}

//go:build unix

package control

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// umaskMu serializes Listen calls: the umask is process-wide state.
var umaskMu sync.Mutex

// Listen creates the control socket at path with mode 0600.
//
// A socket file left behind by a daemon that died is removed first; a
// socket that still answers, or a path that is not a socket, is an error
// rather than something to delete. The socket is created under umask 0177
// so that it is never, even briefly, reachable by other users. Because the
// umask is per process, call Listen at startup, before other goroutines
// create files.
func Listen(path string) (*net.UnixListener, error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}

	umaskMu.Lock()
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	umaskMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}

	// Belt and braces: the umask already gave 0600, but say it explicitly.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}

func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("a stagefs daemon is already listening at %s", path)
	}
	// Only "connection refused" proves that nobody listens. Anything else
	// (say, permission denied) may hide a live daemon of another user.
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("cannot tell whether %s is in use: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package journal

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive, non-blocking flock(2) on f so a second opener
// (another process, or another Open in this one) fails instead of appending
// to the same file. Closing f releases it.
func lockFile(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	err = rc.Control(func(fd uintptr) {
		lerr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
	})
	if err != nil {
		return err
	}
	return lerr
}

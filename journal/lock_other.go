//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package journal

import "os"

// lockFile does nothing where flock(2) is not available; the caller must
// then make sure only one Journal uses a file.
func lockFile(f *os.File) error {
	return nil
}

//go:build !linux

package journal

import "os"

// datasync falls back to File.Sync where fdatasync(2) is not available (on
// macOS File.Sync uses F_FULLFSYNC). stagefs targets Linux, where the cheaper
// fdatasync is used.
func datasync(f *os.File) error {
	return f.Sync()
}

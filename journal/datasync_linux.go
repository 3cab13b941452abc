package journal

import (
	"os"
	"syscall"
)

// datasync flushes the file's data and the metadata needed to read it back
// (its size) with fdatasync(2), which skips the timestamp updates fsync would
// also write.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	// Control keeps the descriptor alive for the duration of the call.
	err = rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			// EINTR means the call did not run to completion, not that
			// writeback failed, so it is safe to repeat.
			if serr != syscall.EINTR {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

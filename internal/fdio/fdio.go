package fdio

import (
	"io"

	"golang.org/x/sys/unix"
)

// Reader reads the descriptor it is; it retries EINTR and reports io.EOF
// at the end of the file.
type Reader int

func (r Reader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, err
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// Writer writes the descriptor it is, all of p or an error.
type Writer int

func (w Writer) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(int(w), p[done:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// Copy copies src, from its offset to its end, onto dst at its offset in
// the kernel (copy_file_range: a reflink where the file system shares
// extents, else a copy that never reaches user space), and returns the
// bytes copied. It goes on until the end of the file, which may have grown
// or shrunk since expect was read from a stat. Where the kernel refuses
// (another file system, an old kernel, a pipe), or copies nothing without
// an error although expect says there is something (some kernels do that
// between certain file systems), it reads and writes instead, from where
// the copy stopped.
func Copy(src, dst int, expect int64) (int64, error) {
	var done int64
	for {
		n, err := unix.CopyFileRange(src, nil, dst, nil, 1<<30, 0)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EXDEV || err == unix.ENOSYS || err == unix.EOPNOTSUPP || err == unix.EINVAL,
			err == nil && n == 0 && done == 0 && expect > 0:
			rest, err := io.CopyBuffer(Writer(dst), Reader(src), make([]byte, 64<<10))
			return done + rest, err
		case err != nil:
			return done, err
		case n == 0:
			return done, nil
		}
		done += int64(n)
	}
}

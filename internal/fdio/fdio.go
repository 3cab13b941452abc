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
// the copy stopped. A sparse src stays sparse in dst (copySparse).
func Copy(src, dst int, expect int64) (int64, error) {
	var st unix.Stat_t
	if unix.Fstat(src, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Blocks*512 < st.Size {
		if n, ok, err := copySparse(src, dst); ok {
			return n, err
		}
	}
	return copyRest(src, dst, expect)
}

// copyRest is Copy of every byte, holes read as zeros.
func copyRest(src, dst int, expect int64) (int64, error) {
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

// copySparse copies src from its offset to its end onto dst at its offset,
// only the ranges that hold data (SEEK_DATA, SEEK_HOLE): the holes
// between them stay holes, and dst is extended to src's length at the end.
// A 1 GiB file made by truncate copies as the few blocks it has, not as a
// gigabyte of zeros written out. ok is false, with nothing done, where the
// file system cannot say where the data is; both offsets end where Copy's
// would.
func copySparse(src, dst int) (n int64, ok bool, err error) {
	start, err1 := unix.Seek(src, 0, io.SeekCurrent)
	dstStart, err2 := unix.Seek(dst, 0, io.SeekCurrent)
	if err1 != nil || err2 != nil {
		return 0, false, nil
	}
	off := start
	for {
		data, err := unix.Seek(src, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // nothing but a hole from off to the end
		}
		if err != nil {
			if off == start {
				return 0, false, nil // SEEK_DATA is not supported here
			}
			return off - start, true, err
		}
		hole, err := unix.Seek(src, data, unix.SEEK_HOLE)
		if err != nil {
			return off - start, true, err
		}
		if err := copyRange(src, dst, data, dstStart+data-start, hole-data); err != nil {
			return off - start, true, err
		}
		off = hole
	}
	end, err := unix.Seek(src, 0, io.SeekEnd)
	if err != nil {
		return off - start, true, err
	}
	if end < start {
		end = start
	}
	var st unix.Stat_t
	if err := unix.Fstat(dst, &st); err != nil {
		return off - start, true, err
	}
	if st.Size < dstStart+end-start {
		if err := unix.Ftruncate(dst, dstStart+end-start); err != nil {
			return off - start, true, err
		}
	}
	if _, err := unix.Seek(dst, dstStart+end-start, io.SeekStart); err != nil {
		return end - start, true, err
	}
	return end - start, true, nil
}

// copyRange copies n bytes of src at off onto dst at dstOff, in the kernel
// where it can, else by reading and writing.
func copyRange(src, dst int, off, dstOff, n int64) error {
	for n > 0 {
		in, out := off, dstOff
		c, err := unix.CopyFileRange(src, &in, dst, &out, int(min(n, 1<<30)), 0)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EXDEV || err == unix.ENOSYS || err == unix.EOPNOTSUPP || err == unix.EINVAL, err == nil && c == 0:
			return copyRangeByHand(src, dst, off, dstOff, n)
		case err != nil:
			return err
		}
		off, dstOff, n = off+int64(c), dstOff+int64(c), n-int64(c)
	}
	return nil
}

func copyRangeByHand(src, dst int, off, dstOff, n int64) error {
	buf := make([]byte, min(n, 64<<10))
	for n > 0 {
		r, err := unix.Pread(src, buf[:min(n, int64(len(buf)))], off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if r == 0 {
			return nil // the file shrank: its end is where it ends
		}
		if _, err := unix.Pwrite(dst, buf[:r], dstOff); err != nil {
			return err
		}
		off, dstOff, n = off+int64(r), dstOff+int64(r), n-int64(r)
	}
	return nil
}

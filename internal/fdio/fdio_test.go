package fdio

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func copyOf(t *testing.T, src *os.File, expect int64) []byte {
	t.Helper()
	dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	n, err := Copy(int(src.Fd()), int(dst.Fd()), expect)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst.Name())
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != n {
		t.Fatalf("Copy reports %d bytes, the copy has %d", n, len(got))
	}
	return got
}

// Copy takes a regular file from its offset to its end, in the kernel.
func TestCopyFile(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 300000) // 3 MB
	p := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(5, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if got := copyOf(t, f, 1); !bytes.Equal(got, data[5:]) {
		t.Fatalf("copied %d bytes, want %d", len(got), len(data)-5)
	}
}

// A source the kernel refuses to copy from (a pipe: EINVAL) is read and
// written instead; so is an empty regular file.
func TestCopyFallsBack(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data := bytes.Repeat([]byte("pipe\n"), 50000)
	go func() {
		w.Write(data)
		w.Close()
	}()
	if got := copyOf(t, r, 0); !bytes.Equal(got, data) {
		t.Fatalf("copied %d bytes through a pipe, want %d", len(got), len(data))
	}

	p := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := copyOf(t, f, 0); len(got) != 0 {
		t.Fatalf("an empty file copied as %d bytes", len(got))
	}
}

// A sparse file copies as its data: the holes stay holes (a 1 GiB file
// made by truncate does not become a gigabyte on disk), the bytes read
// the same, and the copy ends where the source does, hole or not.
func TestCopyKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "src")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 30
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	// Data at the start, in the middle and near the end; a hole last.
	for _, off := range []int64{0, 300 << 20, size - (5 << 20)} {
		if _, err := f.WriteAt([]byte("data at "+string(rune('a'+off%26))), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	src, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(src.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 >= size {
		t.Skip("this file system does not keep holes")
	}
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	n, err := Copy(int(src.Fd()), int(dst.Fd()), size)
	if err != nil || n != size {
		t.Fatalf("Copy: %d bytes, %v", n, err)
	}
	var dt syscall.Stat_t
	if err := syscall.Fstat(int(dst.Fd()), &dt); err != nil {
		t.Fatal(err)
	}
	if dt.Size != size || dt.Blocks*512 > 1<<20 {
		t.Fatalf("the copy is %d bytes in %d KiB of disk, want %d bytes in at most 1 MiB", dt.Size, dt.Blocks/2, size)
	}
	for _, off := range []int64{0, 300 << 20, size - (5 << 20), 7, size - 1} {
		a, b := make([]byte, 16), make([]byte, 16)
		src.ReadAt(a, off)
		dst.ReadAt(b, off)
		if !bytes.Equal(a, b) {
			t.Fatalf("at %d: %q, want %q", off, b, a)
		}
	}
	if off, _ := dst.Seek(0, io.SeekCurrent); off != size {
		t.Fatalf("the copy's offset is %d, want its end %d", off, size)
	}
}

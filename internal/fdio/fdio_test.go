package fdio

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
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

package test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Sparse files stay sparse: at a copy-up (a chmod of a 1 GiB workspace
// file made by truncate) and at a commit (one made in the mount). They
// once became a gigabyte of zeros on disk each time.
func TestSparseFilesStaySparse(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	const size = 1 << 30
	if err := os.Truncate(m.inWS("big"), size); err != nil {
		f, err := os.Create(m.inWS("big"))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		f.Close()
	}
	if used(t, m.inWS("big")) > 1<<20 {
		t.Skip("the workspace's file system does not keep holes")
	}
	sh(t, m.mnt, "chmod 600 big && printf x | dd of=big bs=1 seek=4096 conv=notrunc status=none && truncate -s 1G new")
	for _, p := range []string{m.in("big"), m.in("new")} {
		if got := used(t, p); got > 1<<20 {
			t.Errorf("%s takes %d KiB in the mount", p, got>>10)
		}
	}
	if got := dirUsage(t, m.state); got > 64<<20 {
		t.Errorf("the state dir takes %d MiB after a copy-up of a sparse file", got>>20)
	}
	m.commit()
	for _, p := range []string{m.inWS("big"), m.inWS("new")} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Size != size || st.Blocks*512 > 1<<20 {
			t.Errorf("%s after the commit: %d bytes in %d KiB", p, st.Size, st.Blocks/2)
		}
	}
	f, err := os.Open(m.inWS("big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 3)
	if _, err := f.ReadAt(b, 4095); err != nil || string(b) != "\x00x\x00" {
		t.Errorf("the committed file at 4095: %q, %v", b, err)
	}
}

func used(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func dirUsage(t *testing.T, dir string) int64 {
	t.Helper()
	var total int64
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512
			}
		}
		return nil
	})
	return total
}

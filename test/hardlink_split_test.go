package test

import (
	"syscall"
	"testing"
)

// A staged hard link committed through one name only: the committed file
// and the name left pending are two files from then on, and must show two
// inode numbers, or the kernel serves them as one (a write to one showing
// in the other, and a commit writing what the view did not show).
func TestCommitOfOneNameOfAStagedHardLink(t *testing.T) {
	parallel(t)
	m := mountStagefs(t)
	sh(t, m.mnt, "echo v1 > a && ln a b")
	if cr := m.commit("a"); len(cr.Committed) != 1 {
		t.Fatalf("commit a: %+v", cr)
	}
	sh(t, m.mnt, "echo more >> a")
	assertFile(t, m.in("a"), "v1\nmore\n")
	assertFile(t, m.in("b"), "v1\n")
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(m.in("a"), &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(m.in("b"), &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Ino == sb.Ino {
		t.Errorf("a and b, two files now, both show inode %d", sa.Ino)
	}
	m.commit()
	assertFile(t, m.inWS("a"), "v1\nmore\n")
	assertFile(t, m.inWS("b"), "v1\n")
}

// The names of a workspace hard link are separate files in the view (a
// write copies one name up alone), so each is its own kernel inode: once
// the kernel took them for one, a write through hl was staged as a write
// of f, and a commit wrote what the mount had not shown.
func TestWorkspaceHardLinkNamesStayApart(t *testing.T) {
	parallel(t)
	t.Run("append through one name", func(t *testing.T) {
		m := mountStagefs(t, withFiles(map[string]string{"f": "1\n"}))
		sh(t, m.ws, "ln f hl")
		sh(t, m.mnt, "ls -l f hl >/dev/null; echo new >> hl")
		assertFile(t, m.in("hl"), "1\nnew\n")
		assertFile(t, m.in("f"), "1\n")
		st := m.status()
		if kinds := statusKinds(st); len(kinds) != 1 || kinds["hl"] == "" {
			t.Fatalf("status: want a change of hl only: %+v", st)
		}
		m.commit()
		assertFile(t, m.inWS("hl"), "1\nnew\n")
	})
	t.Run("writes through both names", func(t *testing.T) {
		m := mountStagefs(t, withFiles(map[string]string{"f": "1\n"}))
		sh(t, m.ws, "ln f hl")
		sh(t, m.mnt, "echo A > f; cat hl f >/dev/null; echo B > hl")
		assertFile(t, m.in("f"), "A\n")
		assertFile(t, m.in("hl"), "B\n")
		m.commit()
		assertFile(t, m.inWS("f"), "A\n")
		assertFile(t, m.inWS("hl"), "B\n")
	})
	t.Run("chmod of one name", func(t *testing.T) {
		m := mountStagefs(t, withFiles(map[string]string{"f": "1\n"}))
		sh(t, m.ws, "ln f hl")
		sh(t, m.mnt, "stat f hl >/dev/null; chmod 600 f")
		for i := 0; i < 2; i++ { // in either order, each name its own
			if got := modeOf(t, m.in("f")); got != 0o600 {
				t.Errorf("f: mode %o, want 600", got)
			}
			if got := modeOf(t, m.in("hl")); got != 0o644 {
				t.Errorf("hl: mode %o, want 644", got)
			}
		}
	})
}

// Both names of a workspace hard link copied up, each alone, stay two
// files after a restart: they once both showed the workspace file's inode
// number again, and the kernel served them as one.
func TestBothNamesOfAWorkspaceHardLinkCopiedUp(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f": "1\n"}))
	sh(t, m.ws, "ln f hl")
	sh(t, m.mnt, "echo A > f; echo B > hl")
	m.unmount()
	m.mount()
	sh(t, m.mnt, "cat f hl >/dev/null; echo C >> f")
	assertFile(t, m.in("f"), "A\nC\n")
	assertFile(t, m.in("hl"), "B\n")
	var sf, sh2 syscall.Stat_t
	if syscall.Stat(m.in("f"), &sf) != nil || syscall.Stat(m.in("hl"), &sh2) != nil || sf.Ino == sh2.Ino {
		t.Errorf("f and hl, two files, show inode %d and %d", sf.Ino, sh2.Ino)
	}
}

package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSettingsRoundTrip(t *testing.T) {
	state := t.TempDir()
	if s, err := LoadSettings(state); err != nil || s.Outside != OutsideReadOnly || len(s.Allow) != 0 {
		t.Fatalf("a state dir with no settings: %+v %v, want the defaults", s, err)
	}
	want := Settings{Outside: OutsideReadOnly, Allow: []string{"/srv/cache", "/home/me/.cache/go-build"}}
	if err := SaveSettings(state, want); err != nil {
		t.Fatal(err)
	}
	got, err := LoadSettings(state)
	if err != nil || got.Outside != want.Outside || strings.Join(got.Allow, ",") != strings.Join(want.Allow, ",") {
		t.Errorf("settings read back: %+v %v, want %+v", got, err, want)
	}
	for _, bad := range []Settings{{Outside: "maybe"}, {Outside: OutsideReadOnly, Allow: []string{"relative"}}, {Outside: OutsideReadOnly, Allow: []string{"/"}}} {
		if err := SaveSettings(state, bad); err == nil {
			t.Errorf("SaveSettings(%+v) accepted it", bad)
		}
	}
	os.WriteFile(filepath.Join(state, settingsFile), []byte(`{"outside":"sometimes"}`), 0o600)
	if _, err := LoadSettings(state); err == nil {
		t.Errorf("LoadSettings accepted a file with outside \"sometimes\"")
	}
}

func TestEscapeLayer(t *testing.T) {
	if got := escapeLayer(`/home/a,b:c\d`); got != `/home/a\,b\:c\\d` {
		t.Errorf("escapeLayer: %q", got)
	}
}

// A layer made by hand as overlayfs makes one: the listing shows the
// highest paths that differ from the real home, and a drop removes them,
// a work dir of mode 000 included.
func TestListAndDropScratch(t *testing.T) {
	state, home := t.TempDir(), t.TempDir()
	for p, content := range map[string]string{".bashrc": "real\n", ".cache/keep/x": "x", "gone.txt": "g"} {
		os.MkdirAll(filepath.Join(home, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(home, p), []byte(content), 0o644)
	}
	layer := homeLayerDir(state, home)
	upper := filepath.Join(layer, "upper")
	for p, content := range map[string]string{".bashrc": "changed\n", ".cache/go-build/ab": "0123456789", ".npm/_cacache/x": "12345"} {
		os.MkdirAll(filepath.Join(upper, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(upper, p), []byte(content), 0o644)
	}
	os.WriteFile(filepath.Join(layer, homePathFile), []byte(home+"\n"), 0o600)
	os.MkdirAll(filepath.Join(layer, "work", "work"), 0o755)
	os.Chmod(filepath.Join(layer, "work", "work"), 0)
	os.MkdirAll(filepath.Join(ScratchDir(state), scratchTmp), 0o755)
	os.WriteFile(filepath.Join(ScratchDir(state), scratchTmp, "t.txt"), []byte("tmp"), 0o644)
	whiteouts := os.Geteuid() == 0
	if whiteouts {
		if err := unix.Mknod(filepath.Join(upper, "gone.txt"), syscall.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}

	sc, err := ListScratch(state)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range sc.Areas {
		for _, e := range a.Entries {
			got[e.Path] = e.Kind
		}
	}
	want := map[string]string{
		filepath.Join(home, ".bashrc"):         "changed",
		filepath.Join(home, ".cache/go-build"): "new",
		filepath.Join(home, ".npm"):            "new",
		"/tmp/t.txt":                           "new",
	}
	if whiteouts {
		want[filepath.Join(home, "gone.txt")] = "deleted"
	}
	if len(got) != len(want) {
		t.Errorf("ListScratch: %v, want %v", got, want)
	}
	for p, k := range want {
		if got[p] != k {
			t.Errorf("ListScratch lists %s as %q, want %q (all: %v)", p, got[p], k, got)
		}
	}
	if sc.Bytes != int64(len("changed\n")+10+5+3) || sc.InUse || !sc.Areas[0].Home {
		t.Errorf("ListScratch: %d bytes, in use %v, areas %+v", sc.Bytes, sc.InUse, sc.Areas)
	}

	// A run holds the lock shared: the layer is in use, and no drop.
	lk, err := lockFile(filepath.Join(ScratchDir(state), scratchLock))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := lock(lk, unix.F_RDLCK, false); !ok || err != nil {
		t.Fatalf("lock: %v %v", ok, err)
	}
	if sc, _ := ListScratch(state); !sc.InUse {
		t.Errorf("ListScratch while a run holds the lock: not in use")
	}
	if err := DropScratch(state); !errors.Is(err, ErrScratchInUse) {
		t.Errorf("DropScratch while a run holds the lock: %v", err)
	}
	lk.Close()
	if err := DropScratch(state); err != nil {
		t.Fatalf("DropScratch: %v", err)
	}
	if sc, err := ListScratch(state); err != nil || len(sc.Areas) != 0 || sc.Bytes != 0 {
		t.Errorf("ListScratch after a drop: %+v %v", sc, err)
	}
	if _, err := os.Stat(layer); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the home layer is still there after a drop: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(home, ".bashrc")); err != nil || string(b) != "real\n" {
		t.Errorf("the real home changed: %q %v", b, err)
	}
}

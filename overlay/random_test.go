package overlay_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

// TestCommitRandomOps stages random sequences of file and directory
// operations (renames across directories included) over a small workspace,
// commits, and checks that the workspace then equals the view. Failing
// seeds print the operations that led there.
func TestCommitRandomOps(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 50
	}
	if s := os.Getenv("STAGEFS_RANDOM_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	for seed := 0; seed < seeds; seed++ {
		h := newHarness(t)
		for d := 0; d < 3; d++ {
			for f := 0; f < 3; f++ {
				h.baseFile(fmt.Sprintf("d%d/f-%d", d, f), fmt.Sprintf("base %d %d\n", d, f))
			}
			h.baseFile(fmt.Sprintf("d%d/s-0/x", d), "in a subdir\n")
		}
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		var log []string
		name := func(kind string) string { return fmt.Sprintf("d%d/%s-%d", rng.IntN(3), kind, rng.IntN(3)) }
		for i := 0; i < 25; i++ {
			var op string
			var err error
			switch rng.IntN(7) {
			case 0:
				p := name("f")
				op = "write " + p
				var f *overlay.File
				if f, _, err = h.e.Create(p, unix.O_WRONLY|unix.O_TRUNC, 0o644, caller); err == nil {
					unix.Pwrite(f.Fd, []byte(fmt.Sprintf("w%d\n", i)), 0)
					h.e.Release(p, f, caller)
				}
			case 1:
				a, b := name("f"), name("f")
				op = "mv " + a + " " + b
				err = h.e.Rename(a, b, 0, caller)
			case 2:
				p := name("f")
				op = "rm " + p
				err = h.e.Unlink(p, caller)
			case 3:
				p := name("s")
				op = "mkdir " + p + " + x"
				if _, err = h.e.Mkdir(p, 0o755, caller); err == nil {
					var f *overlay.File
					if f, _, err = h.e.Create(p+"/x", unix.O_WRONLY, 0o644, caller); err == nil {
						unix.Pwrite(f.Fd, []byte("x\n"), 0)
						h.e.Release(p+"/x", f, caller)
					}
				}
			case 4, 5:
				a, b := name("s"), name("s")
				op = "mv " + a + " " + b
				err = h.e.Rename(a, b, 0, caller)
			case 6:
				p := name("s")
				op = "rm -r " + p
				h.e.Unlink(p+"/x", caller)
				err = h.e.Rmdir(p, caller)
			}
			if err != nil {
				op += " (" + err.Error() + ")"
			}
			log = append(log, op)
		}
		view := h.view()
		res := h.e.Commit(nil, false, overlay.Caller{})
		ws := h.wsSnapshot()
		if len(res.Conflicts)+len(res.Failed) > 0 || !equalMaps(view, ws) {
			t.Fatalf("seed %d: conflicts %v failed %v\nops:\n  %s\nview %v\nworkspace %v", seed, res.Conflicts, res.Failed, strings.Join(log, "\n  "), view, ws)
		}
		h.e.Close()
		h.e = nil
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

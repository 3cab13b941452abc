package overlay_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Random sequences of directory and file operations, with partial
// commits and discards in between, as an agent and a host interleave
// them. Whatever the sequence: a commit never changes the view and
// never fails (nothing else writes the workspace), and committing
// everything at the end makes the workspace the view.
func TestRandomOpsWithPartialCommits(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	if s := os.Getenv("STAGEFS_RANDOM_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("STAGEFS_RANDOM_SEED"); s != "" {
		n, _ := strconv.Atoi(s)
		runRandomOps(t, uint64(n), true)
		return
	}
	var failed []int
	for seed := 0; seed < seeds; seed++ {
		if !runRandomOps(t, uint64(seed), false) {
			failed = append(failed, seed)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d seeds failed: %v (STAGEFS_RANDOM_SEED=N replays one with a trace)", len(failed), seeds, failed)
	}
}

func runRandomOps(t *testing.T, seed uint64, trace bool) bool {
	ok := t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
		h := newHarness(t)
		h.baseFile("d/s-0/x", "x\n")
		h.baseFile("d/f-0", "f0\n")
		h.baseFile("d/f-1", "f1\n")
		rng := rand.New(rand.NewPCG(seed, 1))
		dirs := func() []string {
			var out []string
			var walk func(string)
			walk = func(dir string) {
				ents, err := h.e.ReadDir(dir)
				require.NoError(t, err)
				for _, d := range ents {
					p := strings.TrimPrefix(dir+"/"+d.Name, "/")
					if d.Mode == unix.S_IFDIR {
						out = append(out, p)
						walk(p)
					}
				}
			}
			walk("")
			sort.Strings(out)
			return out
		}
		pick := func(s []string) string { return s[rng.IntN(len(s))] }
		name := func(prefix string) string { return fmt.Sprintf("%s-%d", prefix, rng.IntN(4)) }
		for i := 0; i < 40; i++ {
			ds := dirs()
			require.Contains(t, ds, "d")
			dir := pick(ds)
			// "d" itself stays: the sequence works inside it.
			subs := ds[1:]
			if len(subs) == 0 {
				subs = ds
			}
			var what string
			switch rng.IntN(9) {
			case 0:
				p := dir + "/" + name("s")
				_, err := h.e.Mkdir(p, 0o755, caller)
				what = fmt.Sprintf("mkdir %s: %v", p, err)
			case 1:
				p := dir + "/" + name("f")
				f, _, err := h.e.Create(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644, caller)
				if err == nil {
					unix.Pwrite(f.Fd, []byte(fmt.Sprintf("%s at %d\n", p, i)), 0)
					h.e.Release(p, f, caller)
				}
				what = fmt.Sprintf("write %s: %v", p, err)
			case 2, 3:
				if subs[0] == "d" {
					continue
				}
				src, dst := pick(subs), pick(ds)+"/"+name("s")
				if rng.IntN(2) == 0 {
					dst = dir + "/" + name("s")
				}
				err := h.e.Rename(src, dst, 0, caller)
				what = fmt.Sprintf("rename %s %s: %v", src, dst, err)
			case 4:
				src := dir + "/" + name("f")
				dst := pick(ds) + "/" + name("f")
				err := h.e.Rename(src, dst, 0, caller)
				what = fmt.Sprintf("rename %s %s: %v", src, dst, err)
			case 5:
				p := pick(subs)
				if p == "d" {
					continue
				}
				err := removeAll(h, p)
				what = fmt.Sprintf("rm -rf %s: %v", p, err)
			case 6, 7:
				p := pick(append(ds, dir+"/"+name("f")))
				before := h.view()
				res := h.e.Commit([]string{p}, false, caller)
				require.Empty(t, res.Conflicts, "commit %s", p)
				require.Empty(t, res.Failed, "commit %s", p)
				require.Equal(t, before, h.view(), "commit %s changed the view", p)
				what = fmt.Sprintf("commit %s: %v", p, res.Committed)
			case 8:
				p := pick(ds)
				what = fmt.Sprintf("discard %s: %v", p, h.e.Discard([]string{p}, caller))
			}
			if trace {
				t.Log(what)
				t.Logf("  pending %v", h.pending())
			}
		}
		h.commitAll()
	})
	return ok
}

// removeAll deletes p and everything below it through the engine.
func removeAll(h *harness, p string) error {
	st, err := h.e.Stat(p)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		ents, err := h.e.ReadDir(p)
		if err != nil {
			return err
		}
		for _, d := range ents {
			if err := removeAll(h, p+"/"+d.Name); err != nil {
				return err
			}
		}
		return h.e.Rmdir(p, caller)
	}
	return h.e.Unlink(p, caller)
}

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
// commits and discards in between (of a directory, or of a random part of
// the status listing), as an agent and a host interleave them. Whatever
// the sequence: a commit never changes the view and never conflicts or
// fails (nothing else writes the workspace), no step shows a file in two
// places, and committing everything at the end makes the workspace the
// view. STAGEFS_RANDOM_SEEDS=N runs N seeds (scripts/stress: 10,000).
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
		// Contents of files renamed on their own: discarding only the
		// deletion at the source of a file rename shows the file in
		// both places, as it should (a file rename stages a copy).
		moved := map[string]bool{}
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
				if b, ok, _ := h.e.ReadFile(src); ok {
					moved[fmt.Sprintf("%q", b)] = true
				}
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
				ps := []string{pick(append(ds, dir+"/"+name("f")))}
				if rng.IntN(2) == 0 {
					ps = pendingSubset(h, rng)
				}
				before := h.view()
				res := h.e.Commit(ps, false, caller)
				require.Empty(t, res.Conflicts, "commit %s", ps)
				require.Empty(t, res.Failed, "commit %s", ps)
				require.Equal(t, before, h.view(), "commit %s changed the view", ps)
				what = fmt.Sprintf("commit %s: %v", ps, res.Committed)
			case 8:
				ps := []string{pick(ds)}
				if rng.IntN(2) == 0 {
					ps = pendingSubset(h, rng)
				}
				what = fmt.Sprintf("discard %s: %v", ps, h.e.Discard(ps, caller))
			}
			if trace {
				t.Log(what)
				t.Logf("  pending %v", h.pending())
				var ws []string
				for p := range h.wsSnapshot() {
					ws = append(ws, p)
				}
				sort.Strings(ws)
				t.Logf("  workspace %v", ws)
			}
			requireNoCopies(t, h.view(), moved, what)
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

// pendingSubset picks a random non-empty subset of the pending paths, as a
// host picks from the status listing (nil, which selects everything, when
// nothing is pending).
func pendingSubset(h *harness, rng *rand.Rand) []string {
	var out []string
	for _, c := range h.e.Pending(nil) {
		if rng.IntN(3) == 0 {
			out = append(out, c.Path)
		}
	}
	if len(out) == 0 {
		if all := h.e.Pending(nil); len(all) > 0 {
			out = append(out, all[rng.IntN(len(all))].Path)
		}
	}
	return out
}

// requireNoCopies checks that no file content shows twice in the view:
// every content the sequence writes is unique and, but for the files
// renamed on their own (moved; see above), only moved with their
// directory, so a second place means a directory's entries show both where
// it is and where it was.
func requireNoCopies(t *testing.T, view map[string]string, moved map[string]bool, after string) {
	t.Helper()
	at := map[string]string{}
	for p, v := range view {
		if !strings.HasPrefix(v, "file ") || moved[strings.SplitN(v, " ", 3)[2]] {
			continue
		}
		if q, ok := at[v]; ok {
			require.Failf(t, "a file shows in two places", "after %s: %s and %s both hold %s", after, q, p, v)
		}
		at[v] = p
	}
}

// Sequences the random test found (issue #23, point 6), minimised. Each
// commits part of the pending set, which must neither conflict nor change
// the view, then the rest.
func TestPartialCommitsAroundDirectoryRenames(t *testing.T) {
	partial := func(t *testing.T, h *harness, paths ...string) {
		t.Helper()
		before := h.view()
		h.commit(paths...)
		require.Equal(t, before, h.view(), "commit %v changed the view", paths)
		h.commitAll()
	}
	t.Run("made at the source, then moved with its parent", func(t *testing.T) {
		// The new d/s0/s1 replaced the directory that went to d/s3;
		// when that rename is applied, it replaces nothing any more,
		// though it sits at d/s3/s1/s1 in the view by then.
		h := newHarness(t)
		h.baseDir("d/s0/s1")
		h.rename("d/s0/s1", "d/s3")
		h.mkdir("d/s0/s1")
		h.rename("d/s0", "d/s3/s1")
		partial(t, h, "d/s3/s1/s1")
	})
	t.Run("moved and deleted, holding another rename's source", func(t *testing.T) {
		h := newHarness(t)
		h.baseDir("d/s1/s0/s3")
		h.baseDir("d/s1/s0/s1")
		h.rename("d/s1/s0/s3", "d/s3")
		h.rename("d/s1", "d/s3/s2")
		h.rmdir("d/s3/s2/s0/s1")
		h.rmdir("d/s3/s2/s0")
		h.rmdir("d/s3/s2")
		h.commitAll()
	})
	t.Run("moved and deleted, its old place another rename's destination", func(t *testing.T) {
		h := newHarness(t)
		h.baseFile("d/a/x", "x")
		h.baseFile("d/a/b/y", "y")
		h.rename("d/a", "d/c")
		h.rename("d/c/b", "d/a")
		h.unlink("d/c/x")
		h.rmdir("d/c")
		partial(t, h, "d/a")
	})
	t.Run("a deletion below a deleted directory", func(t *testing.T) {
		// Committing d/s2 brings the whiteout at d/s0/s2, not the
		// deletion of d/s0, whose other entries stay pending.
		h := newHarness(t)
		h.baseFile("d/s0/x", "x")
		h.baseDir("d/s0/s2")
		h.rename("d/s0/s2", "d/s2")
		h.unlink("d/s0/x")
		h.rmdir("d/s0")
		partial(t, h, "d/s2")
	})
	t.Run("a new directory given back its workspace directory, then moved", func(t *testing.T) {
		// After the discard d/s0 is the workspace directory again and
		// shows its number; the rename is checked against it.
		h := newHarness(t)
		h.baseFile("d/s0/x", "x")
		h.rename("d/s0", "d/s1")
		h.mkdir("d/s0")
		h.create("d/s0/f", "f")
		h.e.Discard([]string{"d/s1"}, caller)
		h.rename("d/s0", "d/s2")
		partial(t, h, "d/s2")
	})
	t.Run("a deletion discarded below a directory made anew", func(t *testing.T) {
		for _, below := range []string{"d/s0/x", "d/s0/s2"} {
			h := newHarness(t)
			h.baseFile("d/s0/x", "x")
			h.baseFile("d/s0/s2/f", "f")
			require.NoError(t, removeAll(h, "d/s0"))
			h.mkdir("d/s0")
			before := h.view()
			h.e.Discard([]string{below}, caller)
			require.Equal(t, before, h.view(), "discard %s", below)
			partial(t, h, "d/s0")
		}
	})
	t.Run("moved and deleted, a directory made at its source", func(t *testing.T) {
		h := newHarness(t)
		h.baseFile("d/s0/x", "x")
		h.baseDir("d/s1")
		h.rename("d/s0", "d/s1/s3")
		h.mkdir("d/s0")
		require.NoError(t, removeAll(h, "d/s1/s3"))
		partial(t, h, "d/s1/s3")
	})
	t.Run("moved and deleted, one from inside the other", func(t *testing.T) {
		h := newHarness(t)
		h.baseFile("d/a/b/x", "x")
		h.rename("d/a/b", "d/z")
		require.NoError(t, removeAll(h, "d/z"))
		h.rename("d/a", "d/e")
		require.NoError(t, removeAll(h, "d/e"))
		h.commitAll()
	})
	t.Run("a partner's ancestor with a partner of its own", func(t *testing.T) {
		// Committing d/s3/f brings the rename d/s3, which brings the
		// whiteout at d/s1/s3, now at d/s3/s0/s3, which brings the
		// rename d/s3/s0, which brings the whiteout at d/s1.
		h := newHarness(t)
		h.baseDir("d/s1/s3")
		h.rename("d/s1/s3", "d/s3")
		h.rename("d/s1", "d/s3/s0")
		h.create("d/s3/f", "f")
		h.commit("d/s3/f")
		require.Empty(t, h.pending())
		h.mkdir("d/s1")
		h.commitAll()
	})
	t.Run("a rename discarded, another directory renamed to its source", func(t *testing.T) {
		h := newHarness(t)
		h.baseFile("d/s0/x", "x")
		h.baseDir("d/s2/s2")
		h.rename("d/s0", "d/s1")
		h.rename("d/s2", "d/s0")
		h.e.Discard([]string{"d/s1"}, caller)
		require.Equal(t, "x", h.read("d/s0/x"))
		h.commitAll()
	})
	t.Run("a rename discarded, one from inside it kept", func(t *testing.T) {
		h := newHarness(t)
		h.baseFile("d/s0/s1/f", "f")
		h.rename("d/s0/s1", "d/s1")
		h.rename("d/s0", "d/s1/s1")
		h.e.Discard([]string{"d/s0"}, caller)
		requireNoCopies(t, h.view(), nil, "discard d/s0")
		h.commitAll()
	})
	t.Run("moved over an empty directory under a moved parent, deleted", func(t *testing.T) {
		// The empty directory the move replaced is still at d/s1/s3/s3
		// in the workspace when the deletion is applied.
		h := newHarness(t)
		h.baseDir("d/s1/s3/s3")
		h.baseFile("d/s1/s2/f0", "f0")
		h.rename("d/s1/s3", "d/s3")
		h.rename("d/s1/s2", "d/s3/s3")
		require.NoError(t, removeAll(h, "d/s3/s3"))
		partial(t, h, "d/s3")
	})
	t.Run("moved and deleted inside another moved and deleted", func(t *testing.T) {
		// d/s0/s0's deletion removes the empty d/s1/s0 its move
		// replaced, which d/s0's (of d/s1) needs gone first.
		h := newHarness(t)
		h.baseFile("d/s0/x", "x")
		h.baseDir("d/s1/s0")
		h.rename("d/s0", "d/s1/s0")
		h.mkdir("d/s0")
		h.rename("d/s1", "d/s0")
		require.NoError(t, removeAll(h, "d/s0"))
		h.commitAll()
	})
	t.Run("a rename discarded, a directory made at its source moved since", func(t *testing.T) {
		// d/s3/s2 (workspace d/s1/s2) gets its directory back.
		h := newHarness(t)
		h.baseFile("d/s1/s2/f0", "f0")
		h.rename("d/s1", "d/s3")
		h.rename("d/s3/s2", "d/s0")
		h.mkdir("d/s3/s2")
		h.e.Discard([]string{"d/s0"}, caller)
		require.Equal(t, "f0", h.read("d/s3/s2/f0"))
		partial(t, h, "d/s3")
	})
	t.Run("made at a moved source, committed alone", func(t *testing.T) {
		// The new d/s2/s3/s1 hides the directory still in the
		// workspace there, which the view shows at d/s2/s3/s2: its
		// commit brings that rename.
		h := newHarness(t)
		h.baseFile("d/s3/x", "x")
		h.baseFile("d/s3/s1/f1", "f1")
		h.baseDir("d/s3/s1/s2")
		h.rename("d/s3/s1", "d/s3/s2")
		h.mkdir("d/s2")
		h.rename("d/s3", "d/s2/s3")
		h.mkdir("d/s2/s3/s1")
		partial(t, h, "d/s2/s3/s1")
	})
}

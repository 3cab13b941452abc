package overlay_test

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

// BenchmarkCommit1000 commits 1,000 modified files (scripts/bench reports
// the same through the mount).
func BenchmarkCommit1000(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		h := newHarness(b)
		for j := 0; j < 1000; j++ {
			h.baseFile(fmt.Sprintf("d%d/f%d", j/100, j), "base\n")
		}
		for j := 0; j < 1000; j++ {
			p := fmt.Sprintf("d%d/f%d", j/100, j)
			f, err := h.e.Open(p, unix.O_WRONLY|unix.O_TRUNC, caller)
			if err != nil {
				b.Fatal(err)
			}
			unix.Pwrite(f.Fd, []byte("changed\n"), 0)
			h.e.Release(p, f, caller)
		}
		b.StartTimer()
		res := h.e.Commit(nil, false, overlay.Caller{})
		b.StopTimer()
		if len(res.Committed) != 1000 || len(res.Failed)+len(res.Conflicts) > 0 {
			b.Fatalf("committed %d, failed %v, conflicts %v", len(res.Committed), res.Failed, res.Conflicts)
		}
		h.e.Close()
	}
}

package unidiff

import (
	"bytes"
	"math"
)

// Op says what an Edit does with its line. The values are the characters
// that prefix the line in a unified diff, so an Op can be written as is.
type Op byte

const (
	OpEqual  Op = ' ' // the line is in both inputs
	OpDelete Op = '-' // the line is only in the old input
	OpInsert Op = '+' // the line is only in the new input
)

// Edit is one line of an edit script.
type Edit struct {
	Op Op
	// Text is the line including its terminating '\n'. Only the last line
	// of an input can lack the '\n'. Text aliases the input passed to Lines.
	Text []byte
}

// Lines computes a line diff of a and b and returns it as an edit script:
// every line of a appears, in order, as OpEqual or OpDelete, and every line
// of b appears, in order, as OpEqual or OpInsert. Within each run of changed
// lines the deletions come before the insertions, as in git's output.
//
// Lines are compared including their '\n', so a last line without '\n' is
// different from the same text with one.
//
// The script is minimal unless the inputs are large and very different; see
// the package documentation for the cost limit.
func Lines(a, b []byte) []Edit {
	return diffLines(a, b, 0)
}

// diffLines is Lines with an explicit cost limit for the middle-snake
// search, so tests can exercise the fallback on small inputs. A limit <= 0
// selects the default for the input size.
func diffLines(a, b []byte, costLimit int) []Edit {
	aLines := splitLines(a)
	bLines := splitLines(b)

	// Compare small integers instead of byte slices: equal lines get equal
	// ids, so the inner loops of the search are plain int comparisons.
	ids := make(map[string]int)
	aIDs := lineIDs(aLines, ids)
	bIDs := lineIDs(bLines, ids)

	deleted, inserted := matchLines(aIDs, bIDs, len(ids), costLimit)

	edits := make([]Edit, 0, len(aLines)+len(bLines))
	i, j := 0, 0
	for i < len(aLines) || j < len(bLines) {
		switch {
		case i < len(aLines) && deleted[i]:
			edits = append(edits, Edit{Op: OpDelete, Text: aLines[i]})
			i++
		case j < len(bLines) && inserted[j]:
			edits = append(edits, Edit{Op: OpInsert, Text: bLines[j]})
			j++
		default:
			// Neither line is marked, so both are part of the common
			// subsequence and compare() guarantees they are equal.
			edits = append(edits, Edit{Op: OpEqual, Text: aLines[i]})
			i++
			j++
		}
	}
	return edits
}

// matchLines decides which lines of a are deleted and which lines of b are
// inserted; all other lines form the common subsequence. numIDs is one
// more than the largest line id.
func matchLines(aIDs, bIDs []int, numIDs, costLimit int) (deleted, inserted []bool) {
	deleted = make([]bool, len(aIDs))
	inserted = make([]bool, len(bIDs))

	// A line that occurs in only one input can never be matched, so it is
	// marked changed right away and left out of the search. The shortest
	// script stays the same, and unrelated inputs, the worst case for
	// Myers' algorithm, become cheap.
	inA := make([]bool, numIDs)
	inB := make([]bool, numIDs)
	for _, id := range aIDs {
		inA[id] = true
	}
	for _, id := range bIDs {
		inB[id] = true
	}
	var aKept, bKept []int   // positions of the lines left in the search
	var aShort, bShort []int // their ids
	for i, id := range aIDs {
		if inB[id] {
			aKept = append(aKept, i)
			aShort = append(aShort, id)
		} else {
			deleted[i] = true
		}
	}
	for j, id := range bIDs {
		if inA[id] {
			bKept = append(bKept, j)
			bShort = append(bShort, id)
		} else {
			inserted[j] = true
		}
	}

	if costLimit <= 0 {
		costLimit = defaultCostLimit(len(aShort) + len(bShort))
	}
	d := newDiffer(aShort, bShort, costLimit)
	d.compare(0, len(aShort), 0, len(bShort))
	for i, pos := range aKept {
		deleted[pos] = d.deleted[i]
	}
	for j, pos := range bKept {
		inserted[pos] = d.inserted[j]
	}
	return deleted, inserted
}

// splitLines splits data after every '\n'. The last line lacks the '\n'
// when data does not end with one. Empty input has no lines.
func splitLines(data []byte) [][]byte {
	lines := make([][]byte, 0, bytes.Count(data, []byte{'\n'})+1)
	for len(data) > 0 {
		n := bytes.IndexByte(data, '\n') + 1
		if n == 0 {
			n = len(data)
		}
		// The full slice expression keeps an append by a caller from
		// overwriting the following line.
		lines = append(lines, data[:n:n])
		data = data[n:]
	}
	return lines
}

// lineIDs maps each line to a small integer shared by all equal lines.
func lineIDs(lines [][]byte, ids map[string]int) []int {
	out := make([]int, len(lines))
	for i, l := range lines {
		id, ok := ids[string(l)]
		if !ok {
			id = len(ids)
			ids[string(l)] = id
		}
		out[i] = id
	}
	return out
}

// defaultCostLimit returns how many steps the middle-snake search may take
// before it settles for a heuristic split. Growing with the square root of
// the input keeps typical diffs minimal while bounding the total work to
// roughly (n+m)*sqrt(n+m) for inputs with nothing in common.
func defaultCostLimit(total int) int {
	limit := int(math.Sqrt(float64(total)))
	if limit < 256 {
		limit = 256
	}
	return limit
}

// differ holds the state of one diff computation.
type differ struct {
	a, b []int

	// deleted[i] is set when a[i] is not part of the common subsequence;
	// inserted[j] likewise for b[j].
	deleted, inserted []bool

	// fwd and bwd hold, per diagonal, the furthest point reached by the
	// forward and backward searches. They are scratch space shared by all
	// calls to split, sized for the largest (the first) box.
	fwd, bwd []int

	costLimit int
}

func newDiffer(a, b []int, costLimit int) *differ {
	n := len(a) + len(b) + 3
	return &differ{
		a:         a,
		b:         b,
		deleted:   make([]bool, len(a)),
		inserted:  make([]bool, len(b)),
		fwd:       make([]int, n),
		bwd:       make([]int, n),
		costLimit: costLimit,
	}
}

// compare marks the deleted and inserted lines needed to turn
// a[aLo:aHi] into b[bLo:bHi].
func (d *differ) compare(aLo, aHi, bLo, bHi int) {
	// The second half of each split is handled by this loop instead of a
	// recursive call, which keeps the recursion shallow even when the cost
	// limit makes the splits lopsided.
	for {
		// Common prefixes and suffixes need no search.
		for aLo < aHi && bLo < bHi && d.a[aLo] == d.b[bLo] {
			aLo++
			bLo++
		}
		for aLo < aHi && bLo < bHi && d.a[aHi-1] == d.b[bHi-1] {
			aHi--
			bHi--
		}

		if aLo == aHi || bLo == bHi {
			d.markChanged(aLo, aHi, bLo, bHi)
			return
		}

		x, y, ok := d.split(d.a[aLo:aHi], d.b[bLo:bHi])
		if !ok {
			// No usable split point: replacing the whole box is coarse
			// but correct.
			d.markChanged(aLo, aHi, bLo, bHi)
			return
		}
		d.compare(aLo, aLo+x, bLo, bLo+y)
		aLo += x
		bLo += y
	}
}

// markChanged marks all of a[aLo:aHi] deleted and all of b[bLo:bHi] inserted.
func (d *differ) markChanged(aLo, aHi, bLo, bHi int) {
	for i := aLo; i < aHi; i++ {
		d.deleted[i] = true
	}
	for j := bLo; j < bHi; j++ {
		d.inserted[j] = true
	}
}

// diagRange returns the lowest and highest diagonal visited by step e of a
// search centred on diagonal center, in a box whose diagonals run from
// minK to maxK. Step e visits the diagonals center-e, center-e+2, ...,
// center+e, minus those outside the box. The result is never empty
// because callers only search boxes with at least one line on each side,
// so the box has at least three diagonals.
func diagRange(center, e, minK, maxK int) (lo, hi int) {
	lo, hi = center-e, center+e
	if lo < minK {
		// Round up to an even distance to keep the parity of the step.
		lo += (minK - lo + 1) / 2 * 2
	}
	if hi > maxK {
		hi -= (hi - maxK + 1) / 2 * 2
	}
	return lo, hi
}

// split finds a point (x, y) on a shortest path through the edit graph of
// a and b (Myers' "middle snake"), searching forward from (0, 0) and
// backward from (len(a), len(b)) at the same time. Both a and b must be
// non-empty, and their first lines and their last lines must differ, which
// compare ensures by trimming.
//
// Coordinates: x counts lines of a, y lines of b, and diagonal k holds
// the points with x - y == k. For each diagonal visited, fwd records the
// largest x reached by the forward search and bwd the smallest x reached
// by the backward search; -1 means "not reached".
//
// When the search has taken more than costLimit steps, split returns the
// point that got furthest instead of a point on a shortest path. The
// result is then still a valid split, just not an optimal one. ok is false
// if no split strictly inside the box is available.
func (d *differ) split(a, b []int) (x, y int, ok bool) {
	n, m := len(a), len(b)
	delta := n - m
	// The searches can only meet on a diagonal visited by both, which
	// depends on the parity of delta: if it is odd the forward search
	// checks for an overlap, otherwise the backward search does.
	oddDelta := delta%2 != 0
	minK, maxK := -m, n
	off := m + 1 // diagonal k is stored at index k+off
	fwd := d.fwd[:n+m+3]
	bwd := d.bwd[:n+m+3]

	in := func(k, lo, hi int) bool { return lo <= k && k <= hi }

	// Step 0: follow the diagonal from each corner. After trimming there
	// is nothing to follow, but doing it keeps split correct on its own.
	x = 0
	for x < n && x < m && a[x] == b[x] {
		x++
	}
	fwd[off] = x
	x = n
	for x > 0 && x-delta > 0 && a[x-1] == b[x-delta-1] {
		x--
	}
	bwd[delta+off] = x

	for e := 1; ; e++ {
		if e > n+m {
			// A shortest path never needs more than n+m steps, so this
			// cannot happen; give up rather than loop forever.
			return 0, 0, false
		}

		// Forward step e: extend from diagonals k-1 (one line of a
		// deleted, x+1) and k+1 (one line of b inserted, y+1).
		lo, hi := diagRange(0, e, minK, maxK)
		prevLo, prevHi := diagRange(0, e-1, minK, maxK)
		oldLo, oldHi := diagRange(0, e-2, minK, maxK)
		bLo, bHi := diagRange(delta, e-1, minK, maxK)
		for k := lo; k <= hi; k += 2 {
			best := -1
			// A diagonal visited two steps ago keeps what it had; this
			// matters next to the box edges, where a furthest point may
			// be unable to move on.
			if e >= 2 && in(k, oldLo, oldHi) {
				best = fwd[k+off]
			}
			if in(k-1, prevLo, prevHi) {
				if px := fwd[k-1+off]; px >= 0 && px < n && px+1 > best {
					best = px + 1
				}
			}
			if in(k+1, prevLo, prevHi) {
				if px := fwd[k+1+off]; px >= 0 && px-(k+1) < m && px > best {
					best = px
				}
			}
			if best >= 0 {
				for best < n && best-k < m && a[best] == b[best-k] {
					best++
				}
			}
			fwd[k+off] = best
			if oddDelta && best >= 0 && in(k, bLo, bHi) {
				if bx := bwd[k+off]; bx >= 0 && bx <= best {
					return best, best - k, true
				}
			}
		}

		// Backward step e: extend from diagonals k+1 (x-1) and k-1 (y-1).
		fLo, fHi := lo, hi
		lo, hi = diagRange(delta, e, minK, maxK)
		prevLo, prevHi = bLo, bHi
		oldLo, oldHi = diagRange(delta, e-2, minK, maxK)
		for k := lo; k <= hi; k += 2 {
			best := -1
			if e >= 2 && in(k, oldLo, oldHi) {
				best = bwd[k+off]
			}
			if in(k+1, prevLo, prevHi) {
				if px := bwd[k+1+off]; px > 0 && (best < 0 || px-1 < best) {
					best = px - 1
				}
			}
			if in(k-1, prevLo, prevHi) {
				if px := bwd[k-1+off]; px >= 0 && px-(k-1) > 0 && (best < 0 || px < best) {
					best = px
				}
			}
			if best >= 0 {
				for best > 0 && best-k > 0 && a[best-1] == b[best-k-1] {
					best--
				}
			}
			bwd[k+off] = best
			if !oddDelta && best >= 0 && in(k, fLo, fHi) {
				if fx := fwd[k+off]; fx >= 0 && fx >= best {
					return best, best - k, true
				}
			}
		}

		if e >= d.costLimit {
			return furthestSplit(fwd, bwd, off, n, m, fLo, fHi, lo, hi)
		}
	}
}

// furthestSplit picks the split used when the search hit its cost limit:
// the point of either search that covers the most lines (x+y for the
// forward search, the distance to (n, m) for the backward one). Any point
// of the box gives a correct diff; this choice makes the most progress.
func furthestSplit(fwd, bwd []int, off, n, m, fLo, fHi, bLo, bHi int) (x, y int, ok bool) {
	bestGain := 0
	for k := fLo; k <= fHi; k += 2 {
		if fx := fwd[k+off]; fx >= 0 && 2*fx-k > bestGain {
			bestGain = 2*fx - k
			x, y = fx, fx-k
		}
	}
	for k := bLo; k <= bHi; k += 2 {
		if bx := bwd[k+off]; bx >= 0 && n+m-(2*bx-k) > bestGain {
			bestGain = n + m - (2*bx - k)
			x, y = bx, bx-k
		}
	}
	// A split at a corner of the box would not make the problem smaller.
	if x+y <= 0 || x+y >= n+m {
		return 0, 0, false
	}
	return x, y, true
}

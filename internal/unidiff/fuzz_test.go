package unidiff

import (
	"bytes"
	"fmt"
	"testing"
)

// FuzzLines checks that the hunks computed for any two inputs turn the
// first into the second, with the default cost limit and with a tiny one
// that forces the heuristic splits, and that small diffs are minimal.
func FuzzLines(f *testing.F) {
	f.Fuzz(func(t *testing.T, a, b []byte) {
		for _, limit := range []int{0, 1, 3} {
			edits := diffLines(a, b, limit)
			if err := checkScript(a, b, edits); err != nil {
				t.Fatalf("limit %d: %v", limit, err)
			}
			for _, context := range []int{0, 1, DefaultContext} {
				got, err := applyHunks(a, Hunks(edits, context))
				if err != nil {
					t.Fatalf("limit %d, context %d: %v", limit, context, err)
				}
				if !bytes.Equal(got, b) {
					t.Fatalf("limit %d, context %d: applied hunks give %q, want %q", limit, context, got, b)
				}
			}
		}

		// With the default limit and inputs this small the search never
		// reaches the limit, so the script must be a shortest one.
		aLines, bLines := testSplit(a), testSplit(b)
		if len(aLines)+len(bLines) <= 200 {
			want := len(aLines) + len(bLines) - 2*lcsLength(aLines, bLines)
			if got := countChanges(Lines(a, b)); got != want {
				t.Fatalf("%d changed lines, shortest script has %d", got, want)
			}
		}
	})
}

// testSplit splits data into lines without using the package's own
// splitter, so a bug there cannot hide itself.
func testSplit(data []byte) [][]byte {
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// checkScript verifies that edits is an edit script from a to b: the old
// side spells a and the new side spells b, and deletions precede
// insertions within every run of changes.
func checkScript(a, b []byte, edits []Edit) error {
	var old, new []byte
	lastOp := OpEqual
	for i, e := range edits {
		if len(e.Text) == 0 {
			return fmt.Errorf("edit %d has empty text", i)
		}
		if e.Text[len(e.Text)-1] != '\n' {
			// Only the last line of a side lacks '\n'. A deleted last
			// line can still be followed by insertions.
			for _, later := range edits[i+1:] {
				if e.Op != OpDelete || later.Op != OpInsert {
					return fmt.Errorf("edit %d lacks a newline but is not last on its side", i)
				}
			}
		}
		switch e.Op {
		case OpEqual:
			old = append(old, e.Text...)
			new = append(new, e.Text...)
		case OpDelete:
			if lastOp == OpInsert {
				return fmt.Errorf("edit %d: deletion after insertion in one run", i)
			}
			old = append(old, e.Text...)
		case OpInsert:
			new = append(new, e.Text...)
		default:
			return fmt.Errorf("edit %d has bad op %q", i, e.Op)
		}
		lastOp = e.Op
	}
	if !bytes.Equal(old, a) {
		return fmt.Errorf("old side of script is %q, want %q", old, a)
	}
	if !bytes.Equal(new, b) {
		return fmt.Errorf("new side of script is %q, want %q", new, b)
	}
	return nil
}

// applyHunks applies hunks to a like a strict patch tool: every context
// and deleted line must match, hunk headers must agree with their lines,
// and hunks must come in order without overlapping.
func applyHunks(a []byte, hunks []Hunk) ([]byte, error) {
	lines := testSplit(a)
	var out []byte
	next := 0     // index of the first old line not yet copied or consumed
	outLines := 0 // number of lines written to out
	for i, h := range hunks {
		var oldCount, newCount, changes int
		for _, e := range h.Edits {
			if e.Op != OpInsert {
				oldCount++
			}
			if e.Op != OpDelete {
				newCount++
			}
			if e.Op != OpEqual {
				changes++
			}
		}
		if changes == 0 {
			return nil, fmt.Errorf("hunk %d has no changes", i)
		}
		if oldCount != h.OldCount || newCount != h.NewCount {
			return nil, fmt.Errorf("hunk %d: header counts %d,%d but lines give %d,%d",
				i, h.OldCount, h.NewCount, oldCount, newCount)
		}

		pos := h.OldStart - 1
		if h.OldCount == 0 {
			pos = h.OldStart
		}
		if pos < next || pos > len(lines) {
			return nil, fmt.Errorf("hunk %d starts at old line index %d, next unused is %d of %d", i, pos, next, len(lines))
		}
		for _, l := range lines[next:pos] {
			out = append(out, l...)
			outLines++
		}
		wantNewStart := outLines + 1
		if h.NewCount == 0 {
			wantNewStart = outLines
		}
		if h.NewStart != wantNewStart {
			return nil, fmt.Errorf("hunk %d: new start %d, want %d", i, h.NewStart, wantNewStart)
		}

		for j, e := range h.Edits {
			switch e.Op {
			case OpEqual, OpDelete:
				if pos >= len(lines) || !bytes.Equal(lines[pos], e.Text) {
					return nil, fmt.Errorf("hunk %d line %d: %q does not match old text", i, j, e.Text)
				}
				pos++
				if e.Op == OpEqual {
					out = append(out, e.Text...)
					outLines++
				}
			case OpInsert:
				out = append(out, e.Text...)
				outLines++
			}
		}
		next = pos
	}
	for _, l := range lines[next:] {
		out = append(out, l...)
	}
	return out, nil
}

// countChanges returns the number of deleted plus inserted lines.
func countChanges(edits []Edit) int {
	n := 0
	for _, e := range edits {
		if e.Op != OpEqual {
			n++
		}
	}
	return n
}

// lcsLength is the textbook dynamic-programming longest common
// subsequence, used as an independent reference for minimality.
func lcsLength(a, b [][]byte) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			switch {
			case bytes.Equal(a[i-1], b[j-1]):
				cur[j] = prev[j-1] + 1
			case prev[j] >= cur[j-1]:
				cur[j] = prev[j]
			default:
				cur[j] = cur[j-1]
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

package unidiff

import (
	"bufio"
	"strconv"
)

// DefaultContext is the number of unchanged lines shown around each change,
// the same as git's default.
const DefaultContext = 3

// Hunk is one "@@ -OldStart,OldCount +NewStart,NewCount @@" section of a
// unified diff.
//
// OldStart is the 1-based number of the first old line in the hunk, and
// OldCount the number of old lines (OpEqual plus OpDelete edits). When
// OldCount is zero, OldStart is instead the number of the line after which
// the hunk applies (0 for "at the very beginning"), which is the
// convention of diff and git. The New fields work the same way for the
// new text.
type Hunk struct {
	OldStart, OldCount int
	NewStart, NewCount int
	Edits              []Edit // aliases the edit script given to Hunks
}

// Hunks groups the changes of an edit script (as returned by Lines) into
// hunks with up to context unchanged lines before and after each change.
// Changes separated by at most 2*context unchanged lines share a hunk, as
// in git, so that hunks never overlap. An edit script without changes
// yields no hunks.
func Hunks(edits []Edit, context int) []Hunk {
	if context < 0 {
		context = 0
	}
	var hunks []Hunk
	oldLine, newLine := 0, 0 // lines consumed before edits[pos]
	pos := 0
	for {
		// Find the next change; everything before it is unchanged.
		first := pos
		for first < len(edits) && edits[first].Op == OpEqual {
			first++
		}
		if first == len(edits) {
			return hunks
		}
		start := max(first-context, pos)
		oldLine += start - pos
		newLine += start - pos

		// Find the end of the last change that belongs to this hunk.
		end := first
		for {
			for end < len(edits) && edits[end].Op != OpEqual {
				end++
			}
			next := end
			for next < len(edits) && edits[next].Op == OpEqual {
				next++
			}
			if next == len(edits) || next-end > 2*context {
				break
			}
			end = next
		}
		stop := min(end+context, len(edits))

		h := Hunk{Edits: edits[start:stop:stop]}
		for _, e := range h.Edits {
			if e.Op != OpInsert {
				h.OldCount++
			}
			if e.Op != OpDelete {
				h.NewCount++
			}
		}
		h.OldStart = hunkStart(oldLine, h.OldCount)
		h.NewStart = hunkStart(newLine, h.NewCount)
		hunks = append(hunks, h)

		oldLine += h.OldCount
		newLine += h.NewCount
		pos = stop
	}
}

// hunkStart returns the start number written in a hunk header for a range
// of count lines that follows the first before lines.
func hunkStart(before, count int) int {
	if count == 0 {
		return before
	}
	return before + 1
}

// writeHunk writes h in unified diff format.
func writeHunk(w *bufio.Writer, h Hunk) {
	w.WriteString("@@ -")
	writeRange(w, h.OldStart, h.OldCount)
	w.WriteString(" +")
	writeRange(w, h.NewStart, h.NewCount)
	w.WriteString(" @@\n")
	for _, e := range h.Edits {
		w.WriteByte(byte(e.Op))
		w.Write(e.Text)
		if e.Text[len(e.Text)-1] != '\n' {
			// Only the last line of a text can get here. The marker
			// tells patch tools not to add a newline when applying.
			w.WriteString("\n\\ No newline at end of file\n")
		}
	}
}

// writeRange writes "start,count", leaving out ",count" when count is 1
// as git does.
func writeRange(w *bufio.Writer, start, count int) {
	w.WriteString(strconv.Itoa(start))
	if count != 1 {
		w.WriteByte(',')
		w.WriteString(strconv.Itoa(count))
	}
}

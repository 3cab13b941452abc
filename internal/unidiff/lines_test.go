package unidiff

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

func TestSplitLines(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"\n", []string{"\n"}},
		{"a", []string{"a"}},
		{"a\n", []string{"a\n"}},
		{"a\nb", []string{"a\n", "b"}},
		{"a\n\nb\n", []string{"a\n", "\n", "b\n"}},
		{"a\r\nb\r\n", []string{"a\r\n", "b\r\n"}},
	}
	for _, tt := range tests {
		got := splitLines([]byte(tt.in))
		if len(got) != len(tt.want) {
			t.Fatalf("splitLines(%q) = %q, want %q", tt.in, got, tt.want)
		}
		for i := range got {
			if string(got[i]) != tt.want[i] {
				t.Fatalf("splitLines(%q) = %q, want %q", tt.in, got, tt.want)
			}
		}
	}
}

// scriptString renders an edit script compactly, one "op+text" per line,
// for readable comparisons.
func scriptString(edits []Edit) string {
	var b strings.Builder
	for _, e := range edits {
		b.WriteByte(byte(e.Op))
		b.Write(bytes.TrimSuffix(e.Text, []byte("\n")))
		if !bytes.HasSuffix(e.Text, []byte("\n")) {
			b.WriteString("<noeol>")
		}
		b.WriteByte('|')
	}
	return b.String()
}

func TestLinesExamples(t *testing.T) {
	tests := []struct {
		name, a, b, want string
	}{
		{"both empty", "", "", ""},
		{"identical", "a\nb\n", "a\nb\n", " a| b|"},
		{"create", "", "a\nb\n", "+a|+b|"},
		{"delete all", "a\nb\n", "", "-a|-b|"},
		{"modify middle", "a\nb\nc\n", "a\nx\nc\n", " a|-b|+x| c|"},
		{"insert middle", "a\nc\n", "a\nb\nc\n", " a|+b| c|"},
		{"add final newline", "a\nb", "a\nb\n", " a|-b<noeol>|+b|"},
		{"drop final newline", "a\nb\n", "a\nb", " a|-b|+b<noeol>|"},
		{"append after missing newline", "a", "a\nb", "-a<noeol>|+a|+b<noeol>|"},
		{"deletions before insertions", "a\nb\nc\n", "x\ny\n", "-a|-b|-c|+x|+y|"},
		{"move line", "a\nb\nc\nd\n", "b\nc\nd\na\n", "-a| b| c| d|+a|"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			edits := Lines([]byte(tt.a), []byte(tt.b))
			if got := scriptString(edits); got != tt.want {
				t.Fatalf("Lines(%q, %q)\n got %s\nwant %s", tt.a, tt.b, got, tt.want)
			}
			if err := checkScript([]byte(tt.a), []byte(tt.b), edits); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// randomText returns n lines drawn from a small vocabulary, so that the
// inputs have many equal lines and therefore many equally short scripts.
func randomText(rng *rand.Rand, n, vocabulary int, finalNewline bool) []byte {
	var b []byte
	for i := 0; i < n; i++ {
		b = append(b, vocabularyLine(rng, vocabulary)...)
	}
	if !finalNewline && len(b) > 0 {
		b = b[:len(b)-1]
	}
	return b
}

// vocabularyLine returns a random line from a vocabulary of the given size.
func vocabularyLine(rng *rand.Rand, vocabulary int) []byte {
	return fmt.Appendf(nil, "line %d\n", rng.Intn(vocabulary))
}

// mutate applies a few random line insertions, deletions and replacements
// to text, taking new lines from newLine, and randomly decides whether the
// result ends in a newline.
func mutate(rng *rand.Rand, text []byte, newLine func() []byte) []byte {
	lines := testSplit(text)
	// Work on complete lines; the final newline is decided at the end.
	for i, l := range lines {
		if !bytes.HasSuffix(l, []byte("\n")) {
			lines[i] = append(bytes.Clone(l), '\n')
		}
	}
	for n := rng.Intn(6); n > 0; n-- {
		pos := rng.Intn(len(lines) + 1)
		switch op := rng.Intn(3); {
		case op == 0 || pos == len(lines):
			lines = append(lines[:pos], append([][]byte{newLine()}, lines[pos:]...)...)
		case op == 1:
			lines = append(lines[:pos], lines[pos+1:]...)
		default:
			lines[pos] = newLine()
		}
	}
	out := bytes.Join(lines, nil)
	if len(out) > 0 && rng.Intn(3) == 0 {
		out = out[:len(out)-1]
	}
	return out
}

func TestLinesRandomMinimal(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 3000; i++ {
		vocabulary := 1 + rng.Intn(8)
		a := randomText(rng, rng.Intn(40), vocabulary, rng.Intn(4) != 0)
		var b []byte
		if rng.Intn(2) == 0 {
			b = mutate(rng, a, func() []byte { return vocabularyLine(rng, vocabulary) })
		} else {
			b = randomText(rng, rng.Intn(40), vocabulary, rng.Intn(4) != 0)
		}

		edits := Lines(a, b)
		if err := checkScript(a, b, edits); err != nil {
			t.Fatalf("case %d: %v\na=%q\nb=%q", i, err, a, b)
		}
		aLines, bLines := testSplit(a), testSplit(b)
		want := len(aLines) + len(bLines) - 2*lcsLength(aLines, bLines)
		if got := countChanges(edits); got != want {
			t.Fatalf("case %d: %d changed lines, shortest script has %d\na=%q\nb=%q", i, got, want, a, b)
		}

		// A tiny cost limit forces the heuristic splits; the script must
		// stay correct even though it may be longer.
		for _, limit := range []int{1, 2} {
			if err := checkScript(a, b, diffLines(a, b, limit)); err != nil {
				t.Fatalf("case %d, limit %d: %v\na=%q\nb=%q", i, limit, err, a, b)
			}
		}
	}
}

func TestLinesLargeInputs(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	numbered := func(prefix string, n int) []byte {
		var b []byte
		for i := 0; i < n; i++ {
			b = fmt.Appendf(b, "%s%d\n", prefix, i)
		}
		return b
	}

	// Nothing in common: every line is changed.
	a := numbered("a", 100000)
	b := numbered("b", 100000)
	edits := Lines(a, b)
	if err := checkScript(a, b, edits); err != nil {
		t.Fatal(err)
	}
	if got := countChanges(edits); got != 200000 {
		t.Fatalf("unrelated inputs: %d changed lines, want 200000", got)
	}

	// A large file with a few scattered edits stays minimal: every
	// replaced line costs exactly one deletion and one insertion.
	a = numbered("", 200000)
	lines := testSplit(a)
	replaced := 0
	for i := 0; i < len(lines); i += 997 {
		lines[i] = []byte("changed\n")
		replaced++
	}
	b = bytes.Join(lines, nil)
	edits = Lines(a, b)
	if err := checkScript(a, b, edits); err != nil {
		t.Fatal(err)
	}
	if got := countChanges(edits); got != 2*replaced {
		t.Fatalf("scattered edits: %d changed lines, want %d", got, 2*replaced)
	}

	// Lines from a small vocabulary with a third of them replaced: the
	// edit distance is far beyond the cost limit, so the heuristic splits
	// are used. The script must stay correct and close to the 2 changes
	// per replaced line that a plain replacement would cost.
	a = randomText(rng, 30000, 500, true)
	lines = testSplit(a)
	replaced = 0
	for i := range lines {
		if rng.Intn(3) == 0 {
			lines[i] = vocabularyLine(rng, 500)
			replaced++
		}
	}
	b = bytes.Join(lines, nil)
	edits = Lines(a, b)
	if err := checkScript(a, b, edits); err != nil {
		t.Fatal(err)
	}
	t.Logf("vocabulary edits: %d changed lines for %d replaced", countChanges(edits), replaced)
	if got := countChanges(edits); got > 2*replaced {
		t.Fatalf("vocabulary edits: %d changed lines, more than %d", got, 2*replaced)
	}
}

func TestHunks(t *testing.T) {
	// numbered returns lines "1\n" ... "n\n".
	numbered := func(n int) []byte {
		var b []byte
		for i := 1; i <= n; i++ {
			b = fmt.Appendf(b, "%d\n", i)
		}
		return b
	}
	replace := func(text []byte, lineNo int, with string) []byte {
		lines := testSplit(text)
		lines[lineNo-1] = []byte(with)
		return bytes.Join(lines, nil)
	}
	type header struct{ oldStart, oldCount, newStart, newCount int }
	base := numbered(20)
	tests := []struct {
		name    string
		a, b    []byte
		context int
		want    []header
	}{
		{"no change", base, base, 3, nil},
		{"first line", base, replace(base, 1, "x\n"), 3, []header{{1, 4, 1, 4}}},
		{"last line", base, replace(base, 20, "x\n"), 3, []header{{17, 4, 17, 4}}},
		{"middle", base, replace(base, 10, "x\n"), 3, []header{{7, 7, 7, 7}}},
		// Lines 5 and 12 leave 6 unchanged lines between them: one hunk.
		{"gap of 2*context merges", base, replace(replace(base, 5, "x\n"), 12, "y\n"), 3, []header{{2, 14, 2, 14}}},
		// Lines 5 and 13 leave 7: two hunks.
		{"gap above 2*context splits", base, replace(replace(base, 5, "x\n"), 13, "y\n"), 3, []header{{2, 7, 2, 7}, {10, 7, 10, 7}}},
		{"pure insertion without context", base, append(numbered(10), append([]byte("new\n"), base[len(numbered(10)):]...)...), 0, []header{{10, 0, 11, 1}}},
		{"pure deletion without context", base, append(numbered(9), base[len(numbered(10)):]...), 0, []header{{10, 1, 9, 0}}},
		{"create", nil, numbered(2), 3, []header{{0, 0, 1, 2}}},
		{"delete all", numbered(2), nil, 3, []header{{1, 2, 0, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hunks := Hunks(Lines(tt.a, tt.b), tt.context)
			var got []header
			for _, h := range hunks {
				got = append(got, header{h.OldStart, h.OldCount, h.NewStart, h.NewCount})
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("headers %v, want %v", got, tt.want)
			}
			applied, err := applyHunks(tt.a, hunks)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(applied, tt.b) {
				t.Fatalf("applied hunks give %q, want %q", applied, tt.b)
			}
		})
	}
}

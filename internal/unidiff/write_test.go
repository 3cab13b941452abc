package unidiff

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// The expected outputs below were checked against "git diff --cached" for
// the same changes; only git's "index" and "similarity index" lines are
// missing, as documented.
func TestWrite(t *testing.T) {
	tests := []struct {
		name    string
		changes []FileChange
		want    string
	}{
		{
			name: "modify middle line",
			changes: []FileChange{{
				Path:    "src/lib.rs",
				Old:     []byte("a\nb\nc\nd\ne\nf\ng\n"),
				New:     []byte("a\nb\nc\nX\ne\nf\ng\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git a/src/lib.rs b/src/lib.rs
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,7 +1,7 @@
 a
 b
 c
-d
+X
 e
 f
 g
`,
		},
		{
			name: "add at end without trailing newline",
			changes: []FileChange{{
				Path:    "notes.txt",
				Old:     []byte("one\ntwo\n"),
				New:     []byte("one\ntwo\nthree"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git a/notes.txt b/notes.txt
--- a/notes.txt
+++ b/notes.txt
@@ -1,2 +1,3 @@
 one
 two
+three
\ No newline at end of file
`,
		},
		{
			name: "add newline at end",
			changes: []FileChange{{
				Path:    "f",
				Old:     []byte("one\ntwo"),
				New:     []byte("one\ntwo\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git a/f b/f
--- a/f
+++ b/f
@@ -1,2 +1,2 @@
 one
-two
\ No newline at end of file
+two
`,
		},
		{
			name: "delete all content",
			changes: []FileChange{{
				Path:    "f.txt",
				Old:     []byte("a\nb\n"),
				New:     []byte{},
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git a/f.txt b/f.txt
--- a/f.txt
+++ b/f.txt
@@ -1,2 +0,0 @@
-a
-b
`,
		},
		{
			name: "create",
			changes: []FileChange{{
				Path:    "new.txt",
				New:     []byte("x\ny\n"),
				NewMode: 0100644,
			}},
			want: `diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1,2 @@
+x
+y
`,
		},
		{
			name: "create executable",
			changes: []FileChange{{
				Path:    "run.sh",
				New:     []byte("#!/bin/sh\n"),
				NewMode: 0100755,
			}},
			want: `diff --git a/run.sh b/run.sh
new file mode 100755
--- /dev/null
+++ b/run.sh
@@ -0,0 +1 @@
+#!/bin/sh
`,
		},
		{
			name: "delete",
			changes: []FileChange{{
				Path:    "gone.txt",
				Old:     []byte("bye\nnow"),
				OldMode: 0100644,
			}},
			want: `diff --git a/gone.txt b/gone.txt
deleted file mode 100644
--- a/gone.txt
+++ /dev/null
@@ -1,2 +0,0 @@
-bye
-now
\ No newline at end of file
`,
		},
		{
			name: "mode change only",
			changes: []FileChange{{
				Path:    "run.sh",
				Old:     []byte("echo hi\n"),
				New:     []byte("echo hi\n"),
				OldMode: 0100644, NewMode: 0100755,
			}},
			want: `diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
`,
		},
		{
			name: "mode change with edit",
			changes: []FileChange{{
				Path:    "run.sh",
				Old:     []byte("echo hi\n"),
				New:     []byte("echo bye\n"),
				OldMode: 0100755, NewMode: 0100644,
			}},
			want: `diff --git a/run.sh b/run.sh
old mode 100755
new mode 100644
--- a/run.sh
+++ b/run.sh
@@ -1 +1 @@
-echo hi
+echo bye
`,
		},
		{
			name: "rename with edit",
			changes: []FileChange{{
				Path:    "new/name.go",
				OldPath: "old/name.go",
				Old:     []byte("package a\n\nfunc F() {}\n"),
				New:     []byte("package b\n\nfunc F() {}\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			// The empty context line is a lone space, written out here
			// so editors that strip trailing blanks cannot break it.
			want: "diff --git a/old/name.go b/new/name.go\n" +
				"rename from old/name.go\n" +
				"rename to new/name.go\n" +
				"--- a/old/name.go\n" +
				"+++ b/new/name.go\n" +
				"@@ -1,3 +1,3 @@\n" +
				"-package a\n" +
				"+package b\n" +
				" \n" +
				" func F() {}\n",
		},
		{
			name: "pure rename",
			changes: []FileChange{{
				Path:    "b.txt",
				OldPath: "a.txt",
				Old:     []byte("same\n"),
				New:     []byte("same\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git a/a.txt b/b.txt
rename from a.txt
rename to b.txt
`,
		},
		{
			name: "rename with mode change",
			changes: []FileChange{{
				Path:    "b.sh",
				OldPath: "a.sh",
				Old:     []byte("x\n"),
				New:     []byte("x\n"),
				OldMode: 0100644, NewMode: 0100755,
			}},
			want: `diff --git a/a.sh b/b.sh
old mode 100644
new mode 100755
rename from a.sh
rename to b.sh
`,
		},
		{
			name: "NUL after the first 8000 bytes is text",
			changes: []FileChange{{
				Path:    "data",
				Old:     []byte(strings.Repeat("x", 8000) + "\x00\n"),
				New:     []byte(strings.Repeat("x", 8000) + "\x00\ny\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: "diff --git a/data b/data\n--- a/data\n+++ b/data\n@@ -1 +1,2 @@\n " +
				strings.Repeat("x", 8000) + "\x00\n+y\n",
		},
		{
			name: "symlink retargeted",
			changes: []FileChange{{
				Path:    "lnk",
				Old:     []byte("target"),
				New:     []byte("other"),
				OldMode: 0120000, NewMode: 0120000,
			}},
			want: `diff --git a/lnk b/lnk
--- a/lnk
+++ b/lnk
@@ -1 +1 @@
-target
\ No newline at end of file
+other
\ No newline at end of file
`,
		},
		{
			name: "symlink created",
			changes: []FileChange{{
				Path:    "lnk",
				New:     []byte("../dir/file"),
				NewMode: 0120000,
			}},
			want: `diff --git a/lnk b/lnk
new file mode 120000
--- /dev/null
+++ b/lnk
@@ -0,0 +1 @@
+../dir/file
\ No newline at end of file
`,
		},
		{
			name: "symlink replaced by file",
			changes: []FileChange{{
				Path:    "lnk",
				Old:     []byte("target"),
				New:     []byte("hi\n"),
				OldMode: 0120000, NewMode: 0100644,
			}},
			want: `diff --git a/lnk b/lnk
deleted file mode 120000
--- a/lnk
+++ /dev/null
@@ -1 +0,0 @@
-target
\ No newline at end of file
diff --git a/lnk b/lnk
new file mode 100644
--- /dev/null
+++ b/lnk
@@ -0,0 +1 @@
+hi
`,
		},
		{
			name: "empty file created",
			changes: []FileChange{{
				Path:    "empty",
				New:     []byte{},
				NewMode: 0100644,
			}},
			want: `diff --git a/empty b/empty
new file mode 100644
`,
		},
		{
			name: "empty file created with nil content",
			changes: []FileChange{{
				Path:    "empty",
				NewMode: 0100644,
			}},
			want: `diff --git a/empty b/empty
new file mode 100644
`,
		},
		{
			name: "empty file deleted",
			changes: []FileChange{{
				Path:    "empty",
				Old:     []byte{},
				OldMode: 0100644,
			}},
			want: `diff --git a/empty b/empty
deleted file mode 100644
`,
		},
		{
			name: "unchanged is skipped",
			changes: []FileChange{
				{Path: "same", Old: []byte("x\n"), New: []byte("x\n"), OldMode: 0100644, NewMode: 0100644},
				{Path: "other", Old: []byte("1\n"), New: []byte("2\n"), OldMode: 0100644, NewMode: 0100644},
			},
			want: `diff --git a/other b/other
--- a/other
+++ b/other
@@ -1 +1 @@
-1
+2
`,
		},
		{
			name: "group-writable mode is normalised",
			changes: []FileChange{{
				Path: "f", Old: []byte("x\n"), New: []byte("x\n"), OldMode: 0100664, NewMode: 0100644,
			}},
			want: "",
		},
		{
			name: "path with space",
			changes: []FileChange{{
				Path:    "my file.txt",
				Old:     []byte("q\n"),
				New:     []byte("r\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: "diff --git a/my file.txt b/my file.txt\n" +
				"--- a/my file.txt\t\n" +
				"+++ b/my file.txt\t\n" +
				"@@ -1 +1 @@\n-q\n+r\n",
		},
		{
			name: "path needing quotes",
			changes: []FileChange{{
				Path:    "tä\"b",
				Old:     []byte("q\n"),
				New:     []byte("r\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git "a/t\303\244\"b" "b/t\303\244\"b"
--- "a/t\303\244\"b"
+++ "b/t\303\244\"b"
@@ -1 +1 @@
-q
+r
`,
		},
		{
			name: "quoted path with space",
			changes: []FileChange{{
				Path:    "x \"y",
				OldPath: "old\tname",
				Old:     []byte("q\n"),
				New:     []byte("r\n"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: "diff --git \"a/old\\tname\" \"b/x \\\"y\"\n" +
				"rename from \"old\\tname\"\n" +
				"rename to \"x \\\"y\"\n" +
				"--- \"a/old\\tname\"\n" +
				"+++ \"b/x \\\"y\"\t\n" +
				"@@ -1 +1 @@\n-q\n+r\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := Write(&buf, tt.changes); err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != tt.want {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestWriteInvalid(t *testing.T) {
	valid := FileChange{Path: "ok", Old: []byte("a\n"), New: []byte("b\n"), OldMode: 0100644, NewMode: 0100644}
	tests := []struct {
		name   string
		change FileChange
	}{
		{"empty path", FileChange{New: []byte("x"), NewMode: 0100644}},
		{"both sides absent", FileChange{Path: "p"}},
		{"content without mode", FileChange{Path: "p", New: []byte("x")}},
		{"directory mode", FileChange{Path: "p", New: []byte("x"), NewMode: 040000}},
		{"gitlink mode", FileChange{Path: "p", New: []byte("x"), NewMode: 0160000}},
		{"rename of a created file", FileChange{Path: "p", OldPath: "q", New: []byte("x"), NewMode: 0100644}},
		{"rename of a deleted file", FileChange{Path: "p", OldPath: "q", Old: []byte("x"), OldMode: 0100644}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			// The valid change comes first: nothing may be written when a
			// later change is invalid.
			err := Write(&buf, []FileChange{valid, tt.change})
			if err == nil {
				t.Fatalf("no error; output:\n%s", buf.String())
			}
			if buf.Len() != 0 {
				t.Fatalf("wrote %q before failing", buf.String())
			}
		})
	}
}

// TestWriteNonUTF8IsBinary checks that content which is not valid UTF-8
// is written as a binary patch and never as text: the diff is carried in a
// JSON string, where invalid bytes would turn into U+FFFD and "git apply"
// would then write a different file.
func TestWriteNonUTF8IsBinary(t *testing.T) {
	latin1Old := []byte("caf\xe9\nna\xefve\n")     // "café", "naïve" in Latin-1
	latin1New := []byte("caf\xe9\nna\xefve!\n")    // one line changed
	random := []byte{0x8f, 0xff, 0x41, 0xc3, 0x0a} // no NUL, not UTF-8
	late := []byte(strings.Repeat("y\n", 5000) + "\xfe\n")
	tests := []struct {
		name   string
		c      FileChange
		header string
	}{
		{
			name:   "Latin-1 modified",
			c:      FileChange{Path: "l1.txt", Old: latin1Old, New: latin1New, OldMode: 0100644, NewMode: 0100644},
			header: "diff --git a/l1.txt b/l1.txt\n",
		},
		{
			name:   "random bytes created",
			c:      FileChange{Path: "r.bin", New: random, NewMode: 0100644},
			header: "diff --git a/r.bin b/r.bin\nnew file mode 100644\n",
		},
		{
			name:   "text becomes Latin-1",
			c:      FileChange{Path: "t", Old: []byte("cafe\n"), New: latin1Old, OldMode: 0100644, NewMode: 0100644},
			header: "diff --git a/t b/t\n",
		},
		{
			name:   "Latin-1 deleted",
			c:      FileChange{Path: "d", Old: latin1Old, OldMode: 0100644},
			header: "diff --git a/d b/d\ndeleted file mode 100644\n",
		},
		{
			// git looks only at the first 8000 bytes for NUL; an invalid
			// byte anywhere must count.
			name:   "invalid byte after the first 8000",
			c:      FileChange{Path: "late", Old: []byte("y\n"), New: late, OldMode: 0100644, NewMode: 0100644},
			header: "diff --git a/late b/late\n",
		},
		{
			name:   "symlink to a Latin-1 name",
			c:      FileChange{Path: "lnk", New: []byte("caf\xe9"), NewMode: 0120000},
			header: "diff --git a/lnk b/lnk\nnew file mode 120000\n",
		},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := Write(&buf, []FileChange{tt.c}); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		checkBinaryPatch(t, tt.name, buf.String(), tt.header, tt.c)
		if !utf8.Valid(buf.Bytes()) {
			t.Errorf("%s: output is not valid UTF-8: %q", tt.name, buf.String())
		}
	}

	// Valid multi-byte UTF-8 is still text.
	var buf bytes.Buffer
	c := FileChange{Path: "u.txt", Old: []byte("café\n"), New: []byte("naïve\n"), OldMode: 0100644, NewMode: 0100644}
	if err := Write(&buf, []FileChange{c}); err != nil {
		t.Fatal(err)
	}
	if want := "diff --git a/u.txt b/u.txt\n--- a/u.txt\n+++ b/u.txt\n@@ -1 +1 @@\n-café\n+naïve\n"; buf.String() != want {
		t.Errorf("UTF-8 text: got\n%q\nwant\n%q", buf.String(), want)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteReportsWriterError(t *testing.T) {
	changes := []FileChange{{Path: "f", New: []byte("x\n"), NewMode: 0100644}}
	if err := Write(failingWriter{}, changes); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("error %v, want the writer's error", err)
	}
}

func TestQuotePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"a/plain.txt", "a/plain.txt"},
		{"a/with space", "a/with space"},
		{"a/it's", "a/it's"},
		{"a/q\"uote", `"a/q\"uote"`},
		{`a/back\slash`, `"a/back\\slash"`},
		{"a/tab\there", `"a/tab\there"`},
		{"a/new\nline", `"a/new\nline"`},
		{"a/c\a\b\v\f\rz", `"a/c\a\b\v\f\rz"`},
		{"a/d\x7fe\x01", `"a/d\177e\001"`},
		{"a/ä", `"a/\303\244"`},
		{"a/\xff", `"a/\377"`},
	}
	for _, tt := range tests {
		if got := quotePath(tt.in); got != tt.want {
			t.Errorf("quotePath(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// checkBinaryPatch checks that out is header, then a full index line for
// c's sides, "GIT binary patch", and two literal hunks that inflate to c's
// new and old content.
func checkBinaryPatch(t *testing.T, name, out, header string, c FileChange) {
	t.Helper()
	oldID, newID := nullID, nullID
	if c.oldPresent() {
		oldID = blobID(c.Old)
	}
	if c.newPresent() {
		newID = blobID(c.New)
	}
	index := "index " + oldID + ".." + newID
	if c.oldPresent() && c.newPresent() && c.OldMode == c.NewMode {
		index += fmt.Sprintf(" %06o", canonicalMode(c.NewMode))
	}
	want := header + index + "\nGIT binary patch\n"
	if !strings.HasPrefix(out, want) {
		t.Errorf("%s: got\n%q\nwant it to start with\n%q", name, out, want)
		return
	}
	lines := strings.Split(strings.TrimPrefix(out, want), "\n")
	for i, side := range [][]byte{c.New, c.Old} {
		var got []byte
		got, lines = decodeLiteral(t, lines)
		if !bytes.Equal(got, side) {
			t.Errorf("%s: literal hunk %d inflates to %q, want %q", name, i, got, side)
		}
	}
	if len(lines) != 1 || lines[0] != "" {
		t.Errorf("%s: trailing lines after the hunks: %q", name, lines)
	}
}

// decodeLiteral reads one "literal N" hunk (base85 lines, then a blank
// line) from lines and returns the inflated data and the remaining lines.
func decodeLiteral(t *testing.T, lines []string) ([]byte, []string) {
	t.Helper()
	var size int
	if len(lines) == 0 || func() bool { _, err := fmt.Sscanf(lines[0], "literal %d", &size); return err != nil }() {
		t.Fatalf("no literal hunk at %q", lines)
	}
	var deflated []byte
	i := 1
	for ; i < len(lines) && lines[i] != ""; i++ {
		l := lines[i]
		n := int(l[0]-'A') + 1
		if l[0] >= 'a' {
			n = int(l[0]-'a') + 27
		}
		var group []byte
		for j := 1; j+5 <= len(l); j += 5 {
			var v uint32
			for _, d := range []byte(l[j : j+5]) {
				v = v*85 + uint32(strings.IndexByte(base85Digits, d))
			}
			group = append(group, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
		}
		if len(group) < n {
			t.Fatalf("line %q holds %d bytes, says %d", l, len(group), n)
		}
		deflated = append(deflated, group[:n]...)
	}
	zr, err := zlib.NewReader(bytes.NewReader(deflated))
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != size {
		t.Fatalf("literal %d inflates to %d bytes", size, len(data))
	}
	return data, lines[i+1:]
}

// TestWriteBinaryPatch: binary changes (NUL bytes) are spelled out as git
// binary patches; a side over MaxBinaryPatch gets only the notice.
func TestWriteBinaryPatch(t *testing.T) {
	for _, tt := range []struct {
		name   string
		c      FileChange
		header string
	}{
		{"modified", FileChange{Path: "img.bin", Old: []byte("a\x00b"), New: []byte("a\x00c"), OldMode: 0100644, NewMode: 0100644}, "diff --git a/img.bin b/img.bin\n"},
		{"text becomes binary", FileChange{Path: "data", Old: []byte("text\n"), New: append([]byte(strings.Repeat("x", 7999)), 0), OldMode: 0100644, NewMode: 0100644}, "diff --git a/data b/data\n"},
		{"created", FileChange{Path: "blob", New: []byte("\x00\x01"), NewMode: 0100644}, "diff --git a/blob b/blob\nnew file mode 100644\n"},
		{"mode and content", FileChange{Path: "x", Old: []byte("\x00"), New: []byte("\x00\x00"), OldMode: 0100644, NewMode: 0100755}, "diff --git a/x b/x\nold mode 100644\nnew mode 100755\n"},
		{"long", FileChange{Path: "long", Old: []byte{0}, New: bytes.Repeat([]byte{0, 1, 2, 3, 250, 251, 7}, 5000), OldMode: 0100644, NewMode: 0100644}, "diff --git a/long b/long\n"},
	} {
		var buf bytes.Buffer
		if err := Write(&buf, []FileChange{tt.c}); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		checkBinaryPatch(t, tt.name, buf.String(), tt.header, tt.c)
	}

	var buf bytes.Buffer
	big := FileChange{Path: "big", Old: []byte{0}, New: make([]byte, MaxBinaryPatch+1), OldMode: 0100644, NewMode: 0100644}
	if err := Write(&buf, []FileChange{big}); err != nil {
		t.Fatal(err)
	}
	if want := "diff --git a/big b/big\nBinary files a/big and b/big differ\n"; buf.String() != want {
		t.Errorf("over MaxBinaryPatch: got %q, want %q", buf.String(), want)
	}
}

// TestBlobID pins blobID to git's object ids (git hash-object).
func TestBlobID(t *testing.T) {
	if got := blobID(nil); got != "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391" {
		t.Errorf("empty blob: %s", got)
	}
	if got := blobID([]byte("hello\n")); got != "ce013625030ba8dba906f756967f9e9ca394464a" {
		t.Errorf("hello blob: %s", got)
	}
}

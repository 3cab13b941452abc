package unidiff

import (
	"bytes"
	"errors"
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
			name: "binary",
			changes: []FileChange{{
				Path:    "img.bin",
				Old:     []byte("a\x00b"),
				New:     []byte("a\x00c"),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git a/img.bin b/img.bin
Binary files a/img.bin and b/img.bin differ
`,
		},
		{
			name: "text becomes binary",
			changes: []FileChange{{
				Path:    "data",
				Old:     []byte("text\n"),
				New:     append([]byte(strings.Repeat("x", 7999)), 0),
				OldMode: 0100644, NewMode: 0100644,
			}},
			want: `diff --git a/data b/data
Binary files a/data and b/data differ
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
			name: "binary created",
			changes: []FileChange{{
				Path:    "blob",
				New:     []byte("\x00\x01"),
				NewMode: 0100644,
			}},
			want: `diff --git a/blob b/blob
new file mode 100644
Binary files /dev/null and b/blob differ
`,
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
// is reported as binary and never written as text: the diff is carried in
// a JSON string, where invalid bytes would turn into U+FFFD and "git
// apply" would then write a different file.
func TestWriteNonUTF8IsBinary(t *testing.T) {
	latin1Old := []byte("caf\xe9\nna\xefve\n")     // "café", "naïve" in Latin-1
	latin1New := []byte("caf\xe9\nna\xefve!\n")    // one line changed
	random := []byte{0x8f, 0xff, 0x41, 0xc3, 0x0a} // no NUL, not UTF-8
	late := []byte(strings.Repeat("y\n", 5000) + "\xfe\n")
	tests := []struct {
		name string
		c    FileChange
		want string
	}{
		{
			name: "Latin-1 modified",
			c:    FileChange{Path: "l1.txt", Old: latin1Old, New: latin1New, OldMode: 0100644, NewMode: 0100644},
			want: "diff --git a/l1.txt b/l1.txt\nBinary files a/l1.txt and b/l1.txt differ\n",
		},
		{
			name: "random bytes created",
			c:    FileChange{Path: "r.bin", New: random, NewMode: 0100644},
			want: "diff --git a/r.bin b/r.bin\nnew file mode 100644\nBinary files /dev/null and b/r.bin differ\n",
		},
		{
			name: "text becomes Latin-1",
			c:    FileChange{Path: "t", Old: []byte("cafe\n"), New: latin1Old, OldMode: 0100644, NewMode: 0100644},
			want: "diff --git a/t b/t\nBinary files a/t and b/t differ\n",
		},
		{
			name: "Latin-1 deleted",
			c:    FileChange{Path: "d", Old: latin1Old, OldMode: 0100644},
			want: "diff --git a/d b/d\ndeleted file mode 100644\nBinary files a/d and /dev/null differ\n",
		},
		{
			// git looks only at the first 8000 bytes for NUL; an invalid
			// byte anywhere must count.
			name: "invalid byte after the first 8000",
			c:    FileChange{Path: "late", Old: []byte("y\n"), New: late, OldMode: 0100644, NewMode: 0100644},
			want: "diff --git a/late b/late\nBinary files a/late and b/late differ\n",
		},
		{
			name: "symlink to a Latin-1 name",
			c:    FileChange{Path: "lnk", New: []byte("caf\xe9"), NewMode: 0120000},
			want: "diff --git a/lnk b/lnk\nnew file mode 120000\nBinary files /dev/null and b/lnk differ\n",
		},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		if err := Write(&buf, []FileChange{tt.c}); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := buf.String(); got != tt.want {
			t.Errorf("%s: got\n%q\nwant\n%q", tt.name, got, tt.want)
		}
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

package unidiff

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// FileChange describes one path's change.
//
// A side is absent when both its content is nil and its mode is 0: a
// created file has Old == nil and OldMode == 0, a deleted file has
// New == nil and NewMode == 0. A present side must have a mode; an empty
// file is present with empty (nil or non-nil) content and a mode.
type FileChange struct {
	Path    string // workspace-relative, slash-separated, e.g. "src/lib.rs"
	OldPath string // for a rename: the source path; "" otherwise
	Old     []byte
	New     []byte
	// OldMode and NewMode hold the type and permission bits as git stores
	// them: 0100644, 0100755 or 0120000 (symlink); 0 when absent. Other
	// permission bits on regular files are normalised the way git does:
	// any execute bit means 0100755, otherwise 0100644.
	OldMode uint32
	NewMode uint32
}

const (
	modeTypeMask = 0170000
	modeRegular  = 0100000
	modeSymlink  = 0120000

	modeFile       = 0100644
	modeExecutable = 0100755
)

// binaryProbeSize is how much of a file git looks at to decide whether it
// is binary.
const binaryProbeSize = 8000

// MaxBinaryPatch is the largest side of a binary change that Write spells
// out as a "GIT binary patch"; larger ones get only a "Binary files ...
// differ" notice, so that a diff stays a readable size.
const MaxBinaryPatch = 1 << 20

// Write writes a git-style unified diff of changes to w, in the order
// given. Changes with nothing to show (same content, mode and path) are
// skipped. All changes are validated before anything is written, so an
// invalid change produces an error and no output.
//
// For each change Write emits a "diff --git a/P b/P" line, then as needed
// "new file mode", "deleted file mode", "old mode"/"new mode" and
// "rename from"/"rename to" lines, and then either "Binary files ...
// differ" (when either side has a NUL byte in its first 8000 bytes or is
// not valid UTF-8) or "---"/"+++" lines with "@@" hunks of DefaultContext
// lines of context. The output is always valid UTF-8.
// A change between a regular file and a symlink is written as a deletion
// followed by a creation, because git cannot express it in one header.
func Write(w io.Writer, changes []FileChange) error {
	for i := range changes {
		if err := changes[i].validate(); err != nil {
			return fmt.Errorf("unidiff: change %d (%q): %w", i, changes[i].Path, err)
		}
	}
	bw := bufio.NewWriter(w)
	for i := range changes {
		writeChange(bw, &changes[i])
	}
	// bufio.Writer keeps the first write error, so checking Flush is
	// enough.
	return bw.Flush()
}

func (c *FileChange) oldPresent() bool { return c.Old != nil || c.OldMode != 0 }
func (c *FileChange) newPresent() bool { return c.New != nil || c.NewMode != 0 }

func (c *FileChange) validate() error {
	if c.Path == "" {
		return errors.New("empty path")
	}
	oldPresent, newPresent := c.oldPresent(), c.newPresent()
	if !oldPresent && !newPresent {
		return errors.New("both sides absent")
	}
	if oldPresent {
		if err := checkMode(c.OldMode); err != nil {
			return fmt.Errorf("old mode: %w", err)
		}
	}
	if newPresent {
		if err := checkMode(c.NewMode); err != nil {
			return fmt.Errorf("new mode: %w", err)
		}
	}
	if c.OldPath != "" && !(oldPresent && newPresent) {
		return errors.New("rename needs both sides present")
	}
	return nil
}

func checkMode(mode uint32) error {
	switch mode & modeTypeMask {
	case modeRegular, modeSymlink:
		return nil
	case 0:
		return errors.New("missing mode for present content")
	default:
		return fmt.Errorf("unsupported file type in mode %06o", mode)
	}
}

// canonicalMode maps a mode to one of the three modes git records.
func canonicalMode(mode uint32) uint32 {
	if mode&modeTypeMask == modeSymlink {
		return modeSymlink
	}
	if mode&0111 != 0 {
		return modeExecutable
	}
	return modeFile
}

func writeChange(w *bufio.Writer, c *FileChange) {
	oldPath := c.Path
	if c.OldPath != "" {
		oldPath = c.OldPath
	}
	switch {
	case !c.oldPresent():
		writeCreate(w, c.Path, canonicalMode(c.NewMode), c.New)
	case !c.newPresent():
		writeDelete(w, c.Path, canonicalMode(c.OldMode), c.Old)
	default:
		oldMode, newMode := canonicalMode(c.OldMode), canonicalMode(c.NewMode)
		if oldMode&modeTypeMask != newMode&modeTypeMask {
			writeDelete(w, oldPath, oldMode, c.Old)
			writeCreate(w, c.Path, newMode, c.New)
			return
		}
		writeModify(w, oldPath, c.Path, oldMode, newMode, c.Old, c.New)
	}
}

func writeCreate(w *bufio.Writer, path string, mode uint32, data []byte) {
	writeGitHeader(w, path, path)
	fmt.Fprintf(w, "new file mode %06o\n", mode)
	if len(data) == 0 {
		// git writes no "---"/"+++" lines for an empty file; the header
		// alone tells git apply to create it.
		return
	}
	writeContent(w, "/dev/null", "b/"+path, nil, data, 0)
}

func writeDelete(w *bufio.Writer, path string, mode uint32, data []byte) {
	writeGitHeader(w, path, path)
	fmt.Fprintf(w, "deleted file mode %06o\n", mode)
	if len(data) == 0 {
		return
	}
	writeContent(w, "a/"+path, "/dev/null", data, nil, 0)
}

func writeModify(w *bufio.Writer, oldPath, newPath string, oldMode, newMode uint32, old, new []byte) {
	renamed := oldPath != newPath
	sameContent := bytes.Equal(old, new)
	if !renamed && oldMode == newMode && sameContent {
		return
	}
	writeGitHeader(w, oldPath, newPath)
	// git puts the mode lines before the rename lines.
	if oldMode != newMode {
		fmt.Fprintf(w, "old mode %06o\nnew mode %06o\n", oldMode, newMode)
	}
	if renamed {
		w.WriteString("rename from " + quotePath(oldPath) + "\n")
		w.WriteString("rename to " + quotePath(newPath) + "\n")
	}
	if sameContent {
		return
	}
	// git names the mode on the index line only when it did not change.
	var indexMode uint32
	if oldMode == newMode {
		indexMode = newMode
	}
	writeContent(w, "a/"+oldPath, "b/"+newPath, old, new, indexMode)
}

func writeGitHeader(w *bufio.Writer, oldPath, newPath string) {
	w.WriteString("diff --git " + quotePath("a/"+oldPath) + " " + quotePath("b/"+newPath) + "\n")
}

// writeContent writes the part after the extended headers: a binary
// patch or notice, or the "---"/"+++" lines and the hunks. oldName and
// newName are "a/..." and "b/..." or "/dev/null", unquoted; indexMode is
// the mode a binary patch's index line names (0: none).
func writeContent(w *bufio.Writer, oldName, newName string, old, new []byte, indexMode uint32) {
	oldLabel, newLabel := quotePath(oldName), quotePath(newName)
	if isBinary(old) || isBinary(new) {
		if len(old) > MaxBinaryPatch || len(new) > MaxBinaryPatch {
			w.WriteString("Binary files " + oldLabel + " and " + newLabel + " differ\n")
			return
		}
		writeBinaryPatch(w, oldName != "/dev/null", newName != "/dev/null", old, new, indexMode)
		return
	}
	w.WriteString("--- " + oldLabel + fileLabelEnd(oldLabel))
	w.WriteString("+++ " + newLabel + fileLabelEnd(newLabel))
	for _, h := range Hunks(Lines(old, new), DefaultContext) {
		writeHunk(w, h)
	}
}

// writeBinaryPatch writes a change as git diff --binary does: an index
// line with the full object ids (git apply checks the old one against the
// file it patches, and refuses a binary patch without them), then a
// forward and a reverse literal hunk, each the zlib-deflated content in
// git's base85 lines.
func writeBinaryPatch(w *bufio.Writer, oldPresent, newPresent bool, old, new []byte, indexMode uint32) {
	oldID, newID := nullID, nullID
	if oldPresent {
		oldID = blobID(old)
	}
	if newPresent {
		newID = blobID(new)
	}
	w.WriteString("index " + oldID + ".." + newID)
	if indexMode != 0 {
		fmt.Fprintf(w, " %06o", indexMode)
	}
	w.WriteString("\nGIT binary patch\n")
	writeLiteral(w, new)
	writeLiteral(w, old)
}

// nullID is git's object id for "no file".
const nullID = "0000000000000000000000000000000000000000"

// blobID returns the git object id of a blob holding data: the SHA-1 of a
// "blob SIZE\0" header and the data. It names content in git's own format
// for git apply, not as a security boundary.
func blobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// writeLiteral writes one "literal SIZE" hunk: data deflated with zlib,
// in lines of at most 52 bytes, each led by its length ('A'-'Z' for 1-26,
// 'a'-'z' for 27-52) and base85-encoded; a blank line ends the hunk.
func writeLiteral(w *bufio.Writer, data []byte) {
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestCompression) // a valid level never fails
	zw.Write(data)                                         // a bytes.Buffer never fails
	zw.Close()
	fmt.Fprintf(w, "literal %d\n", len(data))
	deflated := z.Bytes()
	for len(deflated) > 0 {
		n := min(len(deflated), 52)
		if n <= 26 {
			w.WriteByte(byte('A' + n - 1))
		} else {
			w.WriteByte(byte('a' + n - 27))
		}
		writeBase85(w, deflated[:n])
		w.WriteByte('\n')
		deflated = deflated[n:]
	}
	w.WriteByte('\n')
}

// base85Digits is git's base85 alphabet (not Ascii85's).
const base85Digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

// writeBase85 encodes data in groups of four bytes, big-endian, as five
// digits each, most significant first; a short last group is padded with
// zero bytes, as git does (the line's length says where the data ends).
func writeBase85(w *bufio.Writer, data []byte) {
	for len(data) > 0 {
		var group [4]byte
		n := copy(group[:], data)
		data = data[n:]
		v := uint32(group[0])<<24 | uint32(group[1])<<16 | uint32(group[2])<<8 | uint32(group[3])
		var digits [5]byte
		for i := 4; i >= 0; i-- {
			digits[i] = base85Digits[v%85]
			v /= 85
		}
		w.Write(digits[:])
	}
}

// fileLabelEnd returns the end of a "---"/"+++" line. Like git, it adds a
// tab after a name that contains a space, because GNU patch takes the
// name to end at the first tab.
func fileLabelEnd(label string) string {
	if strings.IndexByte(label, ' ') >= 0 {
		return "\t\n"
	}
	return "\n"
}

// isBinary reports whether data must be shown as binary: when it has a NUL
// byte within the first 8000 bytes (git's rule), or when any of it is not
// valid UTF-8. The second rule is stagefs's own: a diff travels as a JSON
// string, and encoding/json replaces every invalid byte with U+FFFD, so a
// Latin-1 or random-bytes file shown as text would reach "git apply" as
// different bytes and be applied wrong without a word.
func isBinary(data []byte) bool {
	probe := data
	if len(probe) > binaryProbeSize {
		probe = probe[:binaryProbeSize]
	}
	if bytes.IndexByte(probe, 0) >= 0 {
		return true
	}
	return !utf8.Valid(data)
}

// quotePath returns name as git writes it with core.quotePath enabled (the
// default): unchanged if it has no special bytes, otherwise in double
// quotes with C-style escapes. Spaces alone do not cause quoting.
func quotePath(name string) string {
	if !needsQuoting(name) {
		return name
	}
	var b strings.Builder
	b.Grow(len(name) + 2)
	b.WriteByte('"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch c {
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\v':
			b.WriteString(`\v`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		default:
			if c < 0x20 || c >= 0x7f {
				// Three octal digits, as git does for other control
				// characters, DEL and every byte of a non-ASCII character.
				b.WriteByte('\\')
				s := strconv.FormatUint(uint64(c), 8)
				b.WriteString(strings.Repeat("0", 3-len(s)) + s)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

func needsQuoting(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return true
		}
	}
	return false
}

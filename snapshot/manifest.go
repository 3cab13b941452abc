package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// header is the first line of a manifest: the parts of Info fixed at Create.
// Paths, Bytes and Closed are not stored there because they follow from the
// lines after it.
type header struct {
	ID        string `json:"id"`
	ScopeID   string `json:"scopeId"`
	Turn      string `json:"turn,omitempty"`
	Pid       int    `json:"pid,omitempty"`
	Label     string `json:"label,omitempty"`
	Created   int64  `json:"created"`
	Workspace string `json:"workspace,omitempty"`
}

// line is any manifest line after the header: an Entry, the close marker
// {"closed":true}, or {"uncaptured":PATH} for a path whose pre-image could
// not be stored. The shapes decode into one struct so that a line can be
// told apart without parsing it twice.
type line struct {
	Entry
	Closed     bool   `json:"closed"`
	Uncaptured string `json:"uncaptured,omitempty"`
}

// closeMarker is the last line of a closed snapshot's manifest.
var closeMarker = []byte("{\"closed\":true}\n")

// decoded is a parsed manifest.
type decoded struct {
	hdr        header
	entries    []Entry  // every entry line, in file order (duplicates included)
	uncaptured []string // paths named by uncaptured lines, in file order
	closed     bool
	keep       int // length of the part to keep; bytes after it are a torn tail
}

// decodeManifest parses a manifest file. A torn last line (no trailing
// newline, or not valid JSON) is reported through keep rather than as an
// error, because a crash in the middle of an append leaves exactly that and
// the line was never acknowledged. Anything else that is wrong is an error
// naming the line: a manifest must never lose acknowledged lines silently.
func decodeManifest(data []byte) (decoded, error) {
	var d decoded
	if len(data) == 0 {
		return d, errors.New("empty manifest (no header line)")
	}
	off := 0
	for n := 1; off < len(data); n++ {
		nl := bytes.IndexByte(data[off:], '\n')
		if nl < 0 {
			// An unterminated line was never acknowledged. The header is
			// written by an atomic rename, so it can not be torn.
			if n == 1 {
				return d, errors.New("line 1: header line has no newline")
			}
			break
		}
		raw := data[off : off+nl]
		last := off+nl+1 == len(data)
		if !json.Valid(raw) {
			if last && n > 1 {
				break
			}
			return d, fmt.Errorf("line %d: invalid JSON", n)
		}
		if n == 1 {
			if err := decodeHeader(raw, &d.hdr); err != nil {
				return d, fmt.Errorf("line 1: %w", err)
			}
		} else {
			var l line
			if err := json.Unmarshal(raw, &l); err != nil {
				return d, fmt.Errorf("line %d: %w", n, err)
			}
			if d.closed {
				return d, fmt.Errorf("line %d: line after the close marker", n)
			}
			switch {
			case l.Closed && l.Uncaptured != "":
				return d, fmt.Errorf("line %d: close marker naming an uncaptured path", n)
			case l.Closed:
				if !isZeroEntry(l.Entry) {
					return d, fmt.Errorf("line %d: close marker with entry fields", n)
				}
				d.closed = true
			case l.Uncaptured != "":
				if !isZeroEntry(l.Entry) {
					return d, fmt.Errorf("line %d: uncaptured path with entry fields", n)
				}
				if err := validPath(l.Uncaptured); err != nil {
					return d, fmt.Errorf("line %d: uncaptured path %q: %w", n, l.Uncaptured, err)
				}
				d.uncaptured = append(d.uncaptured, l.Uncaptured)
			default:
				if err := checkEntry(&l.Entry); err != nil {
					return d, fmt.Errorf("line %d: %w", n, err)
				}
				d.entries = append(d.entries, l.Entry)
			}
		}
		off += nl + 1
	}
	d.keep = off
	return d, nil
}

func decodeHeader(raw []byte, h *header) error {
	if err := json.Unmarshal(raw, h); err != nil {
		return err
	}
	if err := ValidID(h.ID); err != nil {
		return err
	}
	if err := ValidScope(h.ScopeID); err != nil {
		return err
	}
	if h.Created <= 0 {
		return fmt.Errorf("bad creation time %d", h.Created)
	}
	return nil
}

// DecodeManifest parses the bytes of a manifest file into the snapshot's Info
// and its entries in capture order. A torn last line is ignored, as Open does
// (Open also truncates it away). An entry for a path captured earlier in the
// same manifest is ignored: the first capture wins. It never panics.
func DecodeManifest(data []byte) (header Info, entries []Entry, err error) {
	d, err := decodeManifest(data)
	if err != nil {
		return Info{}, nil, err
	}
	sn := newSnap(d.hdr)
	for _, e := range d.entries {
		sn.record(e)
	}
	for _, p := range d.uncaptured {
		sn.uncaptured(p)
	}
	sn.info.Closed = d.closed
	return sn.copyInfo(), sn.copyEntries(), nil
}

// marshalLine encodes v as one manifest line. encoding/json escapes control
// characters inside strings, so the only newline is the final one.
func marshalLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// checkEntry rejects entries that the rest of the package can not handle
// safely: a hash names a blob file, so it must be exactly a hex sha256, and
// paths must be in the engine's clean relative form.
func checkEntry(e *Entry) error {
	if err := validPath(e.Path); err != nil {
		return fmt.Errorf("entry path %q: %w", e.Path, err)
	}
	// The workspace root is always a directory and can not be renamed, so
	// only a dir entry can be the root's pre-image.
	if e.Path == "" && e.Kind != KindDir {
		return fmt.Errorf("entry for the root has kind %q", e.Kind)
	}
	switch e.Kind {
	case KindFile:
		if e.Hash.IsZero() {
			return fmt.Errorf("entry %q: a file without a hash", e.Path)
		}
		if e.Size < 0 {
			return fmt.Errorf("entry %q: negative size %d", e.Path, e.Size)
		}
		return nil
	case KindSymlink, KindDir, KindAbsent:
	case KindMoved:
		if e.From == "" {
			return fmt.Errorf("entry %q: moved from the root", e.Path)
		}
		if err := validPath(e.From); err != nil {
			return fmt.Errorf("entry %q: from %q: %w", e.Path, e.From, err)
		}
		if e.From == e.Path {
			return fmt.Errorf("entry %q: moved from itself", e.Path)
		}
	default:
		return fmt.Errorf("entry %q: unknown kind %q", e.Path, e.Kind)
	}
	// Only file entries refer to a body; a hash anywhere else would make
	// the reference counting of blobs ambiguous.
	if !e.Hash.IsZero() {
		return fmt.Errorf("entry %q: kind %s has a hash", e.Path, e.Kind)
	}
	return nil
}

// validPath accepts the engine's form of a workspace path: "" for the root,
// otherwise slash separated names with no empty, ".", ".." or NUL parts.
func validPath(p string) error {
	if p == "" {
		return nil
	}
	if strings.IndexByte(p, 0) >= 0 {
		return errors.New("contains a NUL byte")
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return errors.New("not a clean workspace-relative path")
		}
	}
	return nil
}

// isZeroEntry reports whether e has no field set (a close marker line).
func isZeroEntry(e Entry) bool {
	if len(e.Xattrs) > 0 {
		return false
	}
	e.Xattrs = nil
	return reflect.DeepEqual(e, Entry{})
}

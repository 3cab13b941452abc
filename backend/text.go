package backend

// fs/read_text and fs/safe_text_patch: a host reads a file as the mount
// shows it and writes it back only if nobody changed it in between (a
// compare-and-swap on its sha256), with whole new content or edits that
// must each match exactly once.

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"unicode/utf8"

	"stagefs/control"
	"stagefs/internal/contenthash"
	"stagefs/overlay"
)

func (b *Backend) ReadText(ctx context.Context, path string) (control.ReadTextResult, error) {
	rel, err := b.relPath(path)
	if err != nil {
		return control.ReadTextResult{}, err
	}
	data, exists, err := b.eng.ReadFile(rel)
	if err != nil {
		return control.ReadTextResult{}, fileError(path, err)
	}
	res := control.ReadTextResult{Path: rel, Exists: exists}
	if exists && !utf8.Valid(data) {
		return control.ReadTextResult{}, control.Errorf(control.CodeInvalidParams, "%s is not UTF-8 text (%d bytes); read it through the mount", path, len(data))
	}
	if exists {
		res.Content, res.SHA256, res.Size = string(data), contenthash.Sum(data).String(), int64(len(data))
	}
	return res, nil
}

func (b *Backend) SafeTextPatch(ctx context.Context, p control.SafeTextPatchParams) (control.SafeTextPatchResult, error) {
	rel, err := b.relPath(p.Path)
	if err != nil {
		return control.SafeTextPatchResult{}, err
	}
	var want contenthash.Hash // zero: the file must not exist
	if p.ExpectedHash != "" {
		if want, err = contenthash.Parse(p.ExpectedHash); err != nil {
			return control.SafeTextPatchResult{}, control.Errorf(control.CodeInvalidParams, "expectedHash: %v", err)
		}
	}
	if len(p.Edits) > maxEdits {
		return control.SafeTextPatchResult{}, control.Errorf(control.CodeInvalidParams, "edits: %d of them; at most %d in one patch", len(p.Edits), maxEdits)
	}
	// The edits are applied to the content read before the lock, which
	// every change in the mount waits for: one request with thousands of
	// edits to a large file once held it for minutes. Under the lock the
	// content is only checked to be the same (its hash).
	var edited []byte
	if p.Content == nil {
		if cur, exists, rerr := b.eng.ReadFile(rel); rerr == nil && exists && contenthash.Sum(cur) == want {
			if edited, err = applyEdits(cur, p.Edits, p.Path); err != nil {
				return control.SafeTextPatchResult{}, err
			}
		}
	}
	var res control.SafeTextPatchResult
	err = b.eng.PatchFile(rel, hostEdit(ctx), func(cur []byte, exists bool) ([]byte, bool, error) {
		var curHash contenthash.Hash
		if exists {
			curHash = contenthash.Sum(cur)
		}
		if curHash != want {
			res = control.SafeTextPatchResult{Result: control.PatchStaleBase, SHA256: curHash.String(), Size: int64(len(cur))}
			return nil, false, nil
		}
		var next []byte
		switch {
		case p.Content != nil:
			next = []byte(*p.Content)
		case edited != nil:
			next = edited // made from this very content (the same hash)
		default:
			var err error
			if next, err = applyEdits(cur, p.Edits, p.Path); err != nil {
				return nil, false, err
			}
		}
		if int64(len(next)) > overlay.MaxReadBytes {
			return nil, false, control.Errorf(control.CodeInvalidParams, "the patched %s would be %d bytes, past the %d that fs/read_text reads", p.Path, len(next), overlay.MaxReadBytes)
		}
		if exists && bytes.Equal(next, cur) {
			res = control.SafeTextPatchResult{Result: control.PatchNoOp, SHA256: curHash.String(), Size: int64(len(cur))}
			return nil, false, nil
		}
		res = control.SafeTextPatchResult{Result: control.PatchApplied, SHA256: contenthash.Sum(next).String(), Size: int64(len(next))}
		return next, true, nil
	})
	if errors.Is(err, overlay.ErrBusy) {
		return control.SafeTextPatchResult{}, control.Errorf(control.CodeBusy, "%s: %v; try again when it is closed", p.Path, err)
	}
	if err != nil {
		var ce *control.Error
		if errors.As(err, &ce) {
			return control.SafeTextPatchResult{}, err
		}
		return control.SafeTextPatchResult{}, fileError(p.Path, err)
	}
	if res.Result == control.PatchApplied {
		b.invalidate([]string{rel})
	}
	return res, nil
}

// maxEdits bounds one patch's edits: each is a scan of the whole file.
const maxEdits = 1000

// applyEdits makes each edit of edits in turn to cur; each oldText must
// occur exactly once in the text it is applied to.
func applyEdits(cur []byte, edits []control.TextEdit, path string) ([]byte, error) {
	text := string(cur)
	for i, e := range edits {
		if e.OldText == "" {
			return nil, control.Errorf(control.CodeInvalidParams, "edits[%d].oldText is empty", i)
		}
		if n := strings.Count(text, e.OldText); n != 1 {
			return nil, control.Errorf(control.CodeInvalidParams, "edits[%d].oldText occurs %d times in %s; it must occur exactly once", i, n, path)
		}
		text = strings.Replace(text, e.OldText, e.NewText, 1)
	}
	return []byte(text), nil
}

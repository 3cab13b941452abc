package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"stagefs/control"
	"stagefs/fusefs"
	"stagefs/internal/unidiff"
	"stagefs/journal"
	"stagefs/overlay"
	"stagefs/sandbox"
	"stagefs/snapshot"
)

// backend connects the control server to the engine. It is wiring only:
// path checks, result conversion, events and kernel cache invalidation.
type backend struct {
	cfg       *mountConfig
	eng       *overlay.Engine
	fs        *fusefs.FS
	journal   *journal.Journal
	snaps     *snapshot.Store
	ctl       *control.Server
	sessionID string
	started   time.Time

	dirtyMu sync.Mutex
	dirty   bool
	wake    chan struct{}
}

var _ control.Backend = (*backend)(nil)

// ctlCaller returns the engine Caller for an operation a control socket
// client asked for: the client's pid (from SO_PEERCRED, which the server
// puts in the request's context), so the journal records who committed,
// discarded, switched the mode or patched, with the command name the
// engine looks up in /proc. Uid and Gid stay 0 on purpose: the engine
// would chown a file a patch creates to them, and a patch's file has
// always been owned by the daemon. Without a peer (a call from inside the
// daemon) the Caller is the zero one, as before.
func ctlCaller(ctx context.Context) overlay.Caller {
	peer, ok := control.PeerFrom(ctx)
	if !ok {
		return overlay.Caller{}
	}
	return overlay.Caller{Pid: peer.Pid}
}

// hostEdit is the Caller of the host's own edits (fs/safe_text_patch): the
// client's, marked as the agent's work, so that turns and unbound
// snapshots capture them and they clear redo.
func hostEdit(ctx context.Context) overlay.Caller {
	c := ctlCaller(ctx)
	c.Host = true
	return c
}

// relPath turns a client's path (workspace-relative, or absolute under the
// mount or the workspace) into the engine's form.
func (b *backend) relPath(p string) (string, error) {
	if p == "" {
		return "", control.Errorf(control.CodeInvalidParams, "empty path")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", control.Errorf(control.CodeInvalidParams, "path contains a NUL byte")
	}
	if !utf8.ValidString(p) || strings.ContainsRune(p, utf8.RuneError) {
		// JSON decoding turns invalid UTF-8 and lone surrogates into
		// U+FFFD: acting on that would touch another name.
		return "", control.Errorf(control.CodeInvalidParams, "path %q is not valid UTF-8", p)
	}
	if filepath.IsAbs(p) {
		c := filepath.Clean(p)
		switch {
		case within(c, b.cfg.mountpoint):
			p = strings.TrimPrefix(strings.TrimPrefix(c, b.cfg.mountpoint), "/")
		case within(c, b.cfg.workspace):
			p = strings.TrimPrefix(strings.TrimPrefix(c, b.cfg.workspace), "/")
		default:
			return "", control.Errorf(control.CodePathOutsideWorkspace, "%s is outside the workspace %s and the mount %s", p, b.cfg.workspace, b.cfg.mountpoint)
		}
		if p == "" {
			p = "."
		}
	}
	rel, err := overlay.CleanPath(p)
	if err != nil {
		return "", control.Errorf(control.CodePathOutsideWorkspace, "%s: %v", p, err)
	}
	return rel, nil
}

func (b *backend) relPaths(ps []string) ([]string, error) {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		r, err := b.relPath(p)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (b *backend) Initialize(ctx context.Context) (control.InitializeResult, error) {
	return control.InitializeResult{
		Version:    version,
		SessionID:  b.sessionID,
		Mode:       string(b.eng.Mode()),
		Workspace:  b.cfg.workspace,
		Mount:      b.cfg.mountpoint,
		HookSocket: control.HookSocketName(b.cfg.state),
		Policy:     b.policy(),
		Sandbox:    b.sandboxSettings(),
		Capabilities: map[string]bool{
			"staged": true, "immediate": true, "commitPaths": true, "discardPaths": true,
			"diff": true, "readText": true, "safeTextPatch": true, "log": true, "events": true,
			"snapshots": true, "restoreToolCall": true, "turns": true, "rollback": true, "redo": true,
		},
	}, nil
}

func (b *backend) policy() control.Policy {
	return control.Policy{Deny: nonNil(b.cfg.deny), Hide: nonNil(b.cfg.hide)}
}

// sandboxSettings is what the mount lets its runs write outside the
// workspace (recorded for them in the state dir: sandbox.SaveSettings).
func (b *backend) sandboxSettings() control.Sandbox {
	return control.Sandbox{Outside: b.cfg.outside, Allow: nonNil(b.cfg.allow)}
}

// sandboxStatus is sandboxSettings with the size of the scratch layer,
// which costs a walk of the layer (a status of every path only).
func (b *backend) sandboxStatus() *control.Sandbox {
	s := b.sandboxSettings()
	if sc, err := sandbox.ListScratch(b.cfg.state); err == nil {
		n := 0
		for _, a := range sc.Areas {
			n += len(a.Entries)
		}
		s.Scratch = &control.ScratchUsage{Dir: sc.Dir, Bytes: sc.Bytes, Entries: n, InUse: sc.InUse}
	}
	return &s
}

func (b *backend) SetMode(ctx context.Context, mode string) (control.SetModeResult, error) {
	m, err := overlay.ParseMode(mode)
	if err != nil {
		return control.SetModeResult{}, control.Errorf(control.CodeInvalidParams, "%v", err)
	}
	prev, err := b.eng.SetMode(m, ctlCaller(ctx))
	if err != nil {
		var se *overlay.StateError
		if errors.As(err, &se) {
			return control.SetModeResult{}, control.Errorf(control.CodeInvalidState, "%s", se.Msg)
		}
		return control.SetModeResult{}, err
	}
	b.fs.Invalidate(nil)
	return control.SetModeResult{Previous: string(prev), Mode: string(m)}, nil
}

func (b *backend) Status(ctx context.Context, paths []string) (control.StatusResult, error) {
	rel, err := b.relPaths(paths)
	if err != nil {
		return control.StatusResult{}, err
	}
	now := time.Now()
	res := control.StatusResult{Entries: []control.StatusEntry{}, Mode: string(b.eng.Mode()), Policy: b.policy()}
	changes := b.eng.Pending(rel)
	// A renamed directory is one entry, "rename" with its source: the
	// deletion that hides the source in the pending set is shown only
	// when the rename is not (a status of the source alone).
	movedFrom := map[string]bool{}
	for _, c := range changes {
		if c.Dir && c.From != "" {
			movedFrom[c.From] = true
		}
	}
	for _, c := range changes {
		if movedFrom[c.Path] && c.Kind == "deleted" {
			continue
		}
		age := now.Sub(c.Time).Milliseconds()
		res.Entries = append(res.Entries, control.StatusEntry{
			Path: c.Path, Kind: statusKind(c), From: c.From, Bytes: c.Bytes, AgeMs: age, PID: c.Pid, Comm: c.Comm,
		})
		res.TotalBytes += c.Bytes
		if age > res.OldestPendingAgeMs {
			res.OldestPendingAgeMs = age
		}
	}
	res.PendingCount = len(res.Entries)
	if len(paths) == 0 {
		res.Sandbox = b.sandboxStatus()
	}
	return res, nil
}

func (b *backend) Commit(ctx context.Context, p control.CommitParams) (control.CommitResult, error) {
	rel, err := b.relPaths(p.Paths)
	if err != nil {
		return control.CommitResult{}, err
	}
	r := b.eng.Commit(rel, p.Force, ctlCaller(ctx))
	res := control.CommitResult{Committed: nonNil(r.Committed), Conflicts: []control.Conflict{}, Failed: []control.Failure{}}
	var conflicted []string
	for _, c := range r.Conflicts {
		res.Conflicts = append(res.Conflicts, control.Conflict{Path: c.Path, Reason: c.Reason, Expected: c.Expected, Actual: c.Actual,
			WorkspaceHash: c.WorkspaceHash, StagedHash: c.StagedHash})
		conflicted = append(conflicted, c.Path)
	}
	for _, f := range r.Failed {
		res.Failed = append(res.Failed, control.Failure{Path: f.Path, Reason: f.Reason})
	}
	b.fs.Invalidate(r.Committed)
	if len(r.Committed) > 0 {
		b.publish(control.Event{Kind: "committed", Paths: r.Committed})
	}
	if len(conflicted) > 0 {
		b.publish(control.Event{Kind: "conflict", Paths: conflicted})
	}
	return res, nil
}

// statusKind names a pending change the way the protocol does.
func statusKind(c overlay.Change) string {
	switch c.Kind {
	case "created", "special":
		return control.KindCreate
	case "modified":
		return control.KindWrite
	case "deleted":
		if c.Dir {
			return control.KindRmdir
		}
		return control.KindDelete
	case "renamed":
		return control.KindRename
	case "metadata":
		return control.KindMeta
	}
	return c.Kind // mkdir, symlink
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (b *backend) Discard(ctx context.Context, paths []string) (control.DiscardResult, error) {
	rel, err := b.relPaths(paths)
	if err != nil {
		return control.DiscardResult{}, err
	}
	done := b.eng.Discard(rel, ctlCaller(ctx))
	b.fs.Invalidate(done)
	if len(done) > 0 {
		b.publish(control.Event{Kind: "discarded", Paths: done})
	}
	return control.DiscardResult{Discarded: nonNil(done)}, nil
}

func (b *backend) Diff(ctx context.Context, paths []string) (control.DiffResult, error) {
	rel, err := b.relPaths(paths)
	if err != nil {
		return control.DiffResult{}, err
	}
	changes, err := b.eng.Diff(rel)
	if err != nil {
		return control.DiffResult{}, err
	}
	var buf bytes.Buffer
	if err := unidiff.Write(&buf, changes); err != nil {
		return control.DiffResult{}, err
	}
	return control.DiffResult{Diff: buf.String(), Files: len(changes)}, nil
}

// contentHash names content the way the protocol does: "sha256:" and the
// hex digest.
func contentHash(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func (b *backend) ReadText(ctx context.Context, path string) (control.ReadTextResult, error) {
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
		res.Content, res.SHA256, res.Size = string(data), contentHash(data), int64(len(data))
	}
	return res, nil
}

func fileError(path string, err error) error {
	switch {
	case errors.Is(err, syscall.EISDIR):
		return control.Errorf(control.CodeInvalidParams, "%s is not a regular file", path)
	case errors.Is(err, syscall.EFBIG):
		return control.Errorf(control.CodeInvalidParams, "%s is larger than %d bytes", path, overlay.MaxReadBytes)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ENOENT):
		return control.Errorf(control.CodeNotFound, "%s: %v", path, err)
	case errors.Is(err, syscall.EACCES):
		return control.Errorf(control.CodeInvalidState, "%s: permission denied (a --deny policy covers it, or the file's mode)", path)
	}
	return err
}

func (b *backend) SafeTextPatch(ctx context.Context, p control.SafeTextPatchParams) (control.SafeTextPatchResult, error) {
	rel, err := b.relPath(p.Path)
	if err != nil {
		return control.SafeTextPatchResult{}, err
	}
	want := strings.ToLower(p.ExpectedHash)
	if want != "" && !strings.HasPrefix(want, "sha256:") {
		want = "sha256:" + want
	}
	var res control.SafeTextPatchResult
	err = b.eng.PatchFile(rel, hostEdit(ctx), func(cur []byte, exists bool) ([]byte, bool, error) {
		curHash := ""
		if exists {
			curHash = contentHash(cur)
		}
		if curHash != want {
			res = control.SafeTextPatchResult{Result: control.PatchStaleBase, SHA256: curHash, Size: int64(len(cur))}
			return nil, false, nil
		}
		var next []byte
		if p.Content != nil {
			next = []byte(*p.Content)
		} else {
			text := string(cur)
			for i, e := range p.Edits {
				if e.OldText == "" {
					return nil, false, control.Errorf(control.CodeInvalidParams, "edits[%d].oldText is empty", i)
				}
				if n := strings.Count(text, e.OldText); n != 1 {
					return nil, false, control.Errorf(control.CodeInvalidParams, "edits[%d].oldText occurs %d times in %s; it must occur exactly once", i, n, p.Path)
				}
				text = strings.Replace(text, e.OldText, e.NewText, 1)
			}
			next = []byte(text)
		}
		if exists && bytes.Equal(next, cur) {
			res = control.SafeTextPatchResult{Result: control.PatchNoOp, SHA256: curHash, Size: int64(len(cur))}
			return nil, false, nil
		}
		res = control.SafeTextPatchResult{Result: control.PatchApplied, SHA256: contentHash(next), Size: int64(len(next))}
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
		b.fs.Invalidate([]string{rel})
	}
	return res, nil
}

func (b *backend) Log(ctx context.Context, p control.LogParams) (control.LogResult, error) {
	rel, err := b.relPaths(p.Paths)
	if err != nil {
		return control.LogResult{}, err
	}
	res := control.LogResult{Records: []control.LogEntry{}}
	since := p.Since
	if p.Tail > 0 && len(rel) == 0 && b.journal.LastSeq() > uint64(p.Tail) {
		// The newest records of the whole journal: no need to read it all.
		since = max(since, b.journal.LastSeq()-uint64(p.Tail))
	}
	err = b.journal.Scan(since, func(r journal.Record) error {
		rec, err := overlay.DecodeRecord(r.Seq, r.Payload)
		if err != nil {
			return nil
		}
		if len(rel) > 0 && !touches(rec, rel) {
			return nil
		}
		res.Records = append(res.Records, control.LogEntry{
			Seq: rec.Seq, Time: time.Unix(0, rec.Time).UTC().Format(time.RFC3339Nano), Op: rec.Op,
			Path: rec.Path, Path2: rec.Path2, PID: rec.Pid, Comm: rec.Comm, Size: rec.Size, Mode: rec.Mode, Detail: rec.Detail,
		})
		if p.Tail > 0 && len(res.Records) > p.Tail {
			res.Records = res.Records[1:] // keep the newest
		}
		if p.Limit > 0 && len(res.Records) == p.Limit {
			return errPageFull
		}
		return nil
	})
	if errors.Is(err, errPageFull) {
		err = nil
	}
	return res, err
}

// errPageFull ends a journal scan once a page of the log is full.
var errPageFull = errors.New("page full")

// touches reports whether a record concerns one of the paths (or a path
// below one of them).
func touches(r overlay.Record, paths []string) bool {
	for _, q := range paths {
		for _, p := range []string{r.Path, r.Path2} {
			if p != "" && (q == "" || p == q || strings.HasPrefix(p, q+"/")) {
				return true
			}
		}
		if strings.Contains(r.Detail, `"`+q) {
			return true // commit and discard list their paths in Detail
		}
	}
	return false
}

func (b *backend) publish(ev control.Event) {
	if b.ctl != nil {
		b.ctl.Publish(ev)
	}
}

// pendingChanged is the engine's change callback: it must not block, so it
// only marks the pending set dirty; publishLoop sends at most ten
// staged_writes_pending events a second, and fewer when the pending set is
// large.
func (b *backend) pendingChanged() {
	b.dirtyMu.Lock()
	b.dirty = true
	b.dirtyMu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// publishLoop computes the pending set's totals for staged_writes_pending.
// That walks the whole pending set (a status), so it is done only when
// someone subscribes, and the pause between two of them is at least ten
// times what the last one took: with 10,000 pending files computing them
// every 100 ms took most of the daemon's time and held the engine's lock
// against the very writes being counted.
func (b *backend) publishLoop() {
	pause := 100 * time.Millisecond
	for range b.wake {
		time.Sleep(pause)
		b.dirtyMu.Lock()
		d := b.dirty
		b.dirty = false
		b.dirtyMu.Unlock()
		if !d || b.ctl == nil || b.ctl.Subscribers() == 0 {
			continue
		}
		start := time.Now()
		st, err := b.Status(context.Background(), nil)
		pause = max(100*time.Millisecond, 10*time.Since(start))
		if err != nil {
			continue
		}
		b.publish(control.Event{Kind: control.EventStagedWritesPending, PendingCount: st.PendingCount, TotalBytes: st.TotalBytes})
	}
}

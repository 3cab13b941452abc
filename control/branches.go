package control

import (
	"context"
	"regexp"
)

// Branch methods: a branch is a fork of a view (the mount's main view or
// another branch) with a pending set, journal, snapshots and turns of its
// own, served at a mount point of its own and by a control socket of its
// own (every other method, called on that socket, works on the branch).
// Merging applies what the branch changed since its fork to its parent.
const (
	MethodBranchCreate = "branch/create"
	MethodBranchList   = "branch/list"
	MethodBranchDrop   = "branch/drop"
	MethodBranchMerge  = "branch/merge"
	MethodBranchDiff   = "branch/diff"
)

// BranchBackend answers the branch methods. Every daemon socket, the
// main view's and each branch's, serves them for the whole mount.
type BranchBackend interface {
	CreateBranch(ctx context.Context, p BranchParams) (BranchInfo, error)
	ListBranches(ctx context.Context) (ListBranchesResult, error)
	DropBranch(ctx context.Context, p BranchParams) (BranchInfo, error)
	Merge(ctx context.Context, p MergeParams) (MergeResult, error)
	BranchDiff(ctx context.Context, p BranchDiffParams) (DiffResult, error)
}

// RegisterBranches adds the branch methods to s.
func RegisterBranches(s *Server, b BranchBackend) {
	s.Handle(MethodBranchCreate, Typed(func(ctx context.Context, p BranchParams) (BranchInfo, error) {
		return b.CreateBranch(ctx, p)
	}))
	s.Handle(MethodBranchList, Typed(func(ctx context.Context, _ InitializeParams) (ListBranchesResult, error) {
		r, err := b.ListBranches(ctx)
		r.Branches = nonNil(r.Branches)
		return r, err
	}))
	s.Handle(MethodBranchDrop, Typed(func(ctx context.Context, p BranchParams) (BranchInfo, error) {
		return b.DropBranch(ctx, p)
	}))
	s.Handle(MethodBranchDiff, Typed(func(ctx context.Context, p BranchDiffParams) (DiffResult, error) {
		return b.BranchDiff(ctx, p)
	}))
	s.Handle(MethodBranchMerge, Typed(func(ctx context.Context, p MergeParams) (MergeResult, error) {
		r, err := b.Merge(ctx, p)
		r.Merged = nonNil(r.Merged)
		r.Conflicts = nonNil(r.Conflicts)
		r.Failed = nonNil(r.Failed)
		return r, err
	}))
}

// BranchParams names a branch; From, for branch/create only, the view to
// fork ("" or "main": the mount's main view).
type BranchParams struct {
	Name string `json:"name"`
	From string `json:"from,omitempty"`
}

// Validate checks the names.
func (p BranchParams) Validate() error {
	if !ValidBranchName(p.Name) {
		return invalidParams("name", "a branch name is 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-', and not \"main\": got %q", p.Name)
	}
	if p.From != "" && p.From != MainBranch && !ValidBranchName(p.From) {
		return invalidParams("from", "from %q is not a branch name", p.From)
	}
	return nil
}

// MainBranch names the mount's main view where a branch is expected.
const MainBranch = "main"

var branchName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$`)

// ValidBranchName reports whether name can name a branch (it names a
// directory in the state dir).
func ValidBranchName(name string) bool {
	return name != MainBranch && branchName.MatchString(name)
}

// BranchInfo describes a branch.
type BranchInfo struct {
	Name   string `json:"name"`
	Parent string `json:"parent"` // "main" or a branch's name
	// ForkedAt is when the branch was forked, or last merged into its
	// parent (its fork point moves then), in Unix nanoseconds.
	ForkedAt     int64  `json:"forkedAt"`
	Mount        string `json:"mount"`  // where the branch's view is mounted
	Socket       string `json:"socket"` // its control socket
	Pending      int    `json:"pending"`
	PendingBytes int64  `json:"pendingBytes"`
	// NotServed says why a registered branch is not served (its mount
	// and socket are then empty): it is kept on disk, with its pending
	// set, for the next start or a drop.
	NotServed string `json:"notServed,omitempty"`
}

// ListBranchesResult lists a mount's branches, oldest first.
type ListBranchesResult struct {
	Branches []BranchInfo `json:"branches"`
	// MainMount and MainSocket are the mount's main view's.
	MainMount  string `json:"mainMount"`
	MainSocket string `json:"mainSocket"`
}

// MergeParams merges branch Name into its parent (Into, when set, must
// name it), only Paths (and what is below them) when given. Force applies
// conflicting paths too: the branch's version wins.
type MergeParams struct {
	Name  string   `json:"name"`
	Into  string   `json:"into,omitempty"`
	Paths []string `json:"paths,omitempty"`
	Force bool     `json:"force,omitempty"`
}

// Validate checks the names and paths.
func (p MergeParams) Validate() error {
	if err := (BranchParams{Name: p.Name, From: p.Into}).Validate(); err != nil {
		return err
	}
	return validatePaths(p.Paths)
}

// BranchDiffParams asks for what branch Name changed since its fork point
// (at or below Paths), against the fork point's versions, or, with
// Against naming its parent, against the parent's versions now: what a
// merge would write.
type BranchDiffParams struct {
	Name    string   `json:"name"`
	Against string   `json:"against,omitempty"`
	Paths   []string `json:"paths,omitempty"`
}

// Validate checks the names and paths.
func (p BranchDiffParams) Validate() error {
	if err := (BranchParams{Name: p.Name, From: p.Against}).Validate(); err != nil {
		return err
	}
	return validatePaths(p.Paths)
}

// MergeResult is what a merge applied to the parent's pending set, what it
// left in the branch because the parent changed it too, and what failed.
type MergeResult struct {
	Merged    []string        `json:"merged"`
	Conflicts []MergeConflict `json:"conflicts"`
	Failed    []Failure       `json:"failed"`
}

// MergeConflict is a path both the branch and its parent changed since the
// fork, with the three versions: "absent", "dir", "symlink to T" or "file
// sha256:… (N bytes, mode 0644)".
type MergeConflict struct {
	Path   string `json:"path"`
	Fork   string `json:"fork"`
	Branch string `json:"branch"`
	Parent string `json:"parent"`
}

// CreateBranch calls branch/create, which answers at the fork's instant,
// before the branch is served: ListBranches waits for that.
func (c *Client) CreateBranch(ctx context.Context, p BranchParams) (BranchInfo, error) {
	var r BranchInfo
	err := c.Call(ctx, MethodBranchCreate, p, &r)
	return r, err
}

// ListBranches calls branch/list.
func (c *Client) ListBranches(ctx context.Context) (ListBranchesResult, error) {
	var r ListBranchesResult
	err := c.Call(ctx, MethodBranchList, InitializeParams{}, &r)
	return r, err
}

// DropBranch calls branch/drop.
func (c *Client) DropBranch(ctx context.Context, name string) (BranchInfo, error) {
	var r BranchInfo
	err := c.Call(ctx, MethodBranchDrop, BranchParams{Name: name}, &r)
	return r, err
}

// BranchDiff calls branch/diff.
func (c *Client) BranchDiff(ctx context.Context, p BranchDiffParams) (DiffResult, error) {
	var r DiffResult
	err := c.Call(ctx, MethodBranchDiff, p, &r)
	return r, err
}

// Merge calls branch/merge.
func (c *Client) Merge(ctx context.Context, p MergeParams) (MergeResult, error) {
	var r MergeResult
	err := c.Call(ctx, MethodBranchMerge, p, &r)
	return r, err
}

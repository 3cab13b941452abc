package branch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"stagefs/control"
	"stagefs/internal/atomicfile"
	"stagefs/overlay"
	"stagefs/snapshot"
)

// View is one view the daemon serves, the main view or a branch: what the
// manager needs of it.
type View struct {
	Engine    *overlay.Engine
	Snapshots *snapshot.Store
	StateDir  string
	Mount     string
	Socket    string
	// Close unmounts the view and stops serving it.
	Close func()
	// Invalidate drops what the kernel caches of paths in the view's
	// mount, after a merge changed them behind its back.
	Invalidate func(paths []string)
	// InUse reports whether a run (stagefs run, an agent command, an acp
	// proxy) works in the view now; Unmount unmounts it unless a process
	// holds it.
	InUse   func() bool
	Unmount func() error
	// UnfinishedMerge is a merge into this view a crash interrupted,
	// found in its journal at start-up.
	UnfinishedMerge *overlay.MergeIntent
}

// Host opens a branch's view: the daemon mounts the pending set in
// stateDir at mountpoint and serves its control socket.
type Host interface {
	OpenBranch(name, stateDir, mountpoint string) (View, error)
}

// Config configures a Manager.
type Config struct {
	State     string // the mount's state dir
	Workspace string // real and absolute: absolute paths under it name its paths
	Logf      func(format string, args ...any)
}

// record is a branch as branches.json keeps it.
type record struct {
	Name     string `json:"name"`
	Parent   string `json:"parent"` // control.MainBranch or a branch's name
	ForkedAt int64  `json:"forkedAt"`
	// Fork numbers the branch's current fork point (overlay.ForkScope).
	Fork int `json:"fork"`
	// forking marks, in Manager.saved only, a branch whose fork is
	// being copied.
	forking bool
}

// Manager keeps a mount's branches. Its methods answer the branch/*
// control methods.
type Manager struct {
	cfg Config

	// mu is held through every fork, drop and merge, and while the
	// registry or the open views are read or changed.
	mu    sync.Mutex
	host  Host
	main  *View
	reg   []record         // parents before their children
	views map[string]*View // open branches by name
	// unserved says why a registered branch is not served.
	unserved map[string]error
	// saved is a copy of reg as last saved or loaded, and with a branch
	// being forked (record.forking), for Infos while mu is held by a long
	// operation.
	saved atomic.Pointer[[]record]

	// forkedHook, set only by tests, runs in a fork right after it
	// answered, before its copy.
	forkedHook func()
}

// NewManager returns a manager that answers "not started" until Start.
func NewManager(cfg Config) *Manager {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	m := &Manager{cfg: cfg, views: map[string]*View{}, unserved: map[string]error{}}
	m.saved.Store(&[]record{})
	return m
}

// The branches' state dirs are MAIN/branches/NAME, beside the registry
// MAIN/branches/branches.json.
const (
	dirName      = "branches"
	registryName = "branches.json"
)

func (m *Manager) dir() string { return filepath.Join(m.cfg.State, dirName) }

func (m *Manager) stateOf(name string) string { return filepath.Join(m.dir(), name) }

func (m *Manager) registryPath() string { return filepath.Join(m.dir(), registryName) }

// OfStateDir reports whether state is a branch's state dir, and names the
// branch and the mount's own state dir.
func OfStateDir(state string) (name, main string, ok bool) {
	dir, name := filepath.Split(filepath.Clean(state))
	if filepath.Base(dir) != dirName {
		return "", "", false
	}
	if _, err := os.Stat(filepath.Join(dir, registryName)); err != nil {
		return "", "", false
	}
	return name, filepath.Dir(filepath.Clean(dir)), true
}

// Start opens every branch the registry lists, parents first, and removes
// what a crash left of a branch being made or dropped.
func (m *Manager) Start(main View, host Host) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.main, m.host = &main, host
	b, err := os.ReadFile(m.registryPath())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &m.reg); err != nil {
			return fmt.Errorf("%s: %w", m.registryPath(), err)
		}
	}
	// Every registered branch stays registered and on disk, served or
	// not: one that cannot be served now (its mount busy, its journal
	// damaged) keeps its pending set for the next start, or a drop.
	registered := map[string]bool{}
	for _, r := range m.reg {
		registered[r.Name] = true
	}
	m.removeStrays(registered)
	var errs []error
	for _, r := range m.reg {
		if !control.ValidBranchName(r.Name) || (r.Parent != control.MainBranch && m.views[r.Parent] == nil) {
			errs = append(errs, m.notServedLocked(r.Name, fmt.Errorf("its parent %q is not served; left in %s", r.Parent, m.dir())))
			continue
		}
		v, err := m.open(r)
		if err != nil {
			errs = append(errs, m.notServedLocked(r.Name, fmt.Errorf("%w; its pending set is kept in %s", err, m.stateOf(r.Name))))
			continue
		}
		m.views[r.Name] = v
	}
	saved := append([]record(nil), m.reg...)
	m.saved.Store(&saved)
	if err := m.finishMerges(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// notServedLocked notes why the registered branch name is not served,
// for the clients that name it, and returns it as an error for the log.
func (m *Manager) notServedLocked(name string, why error) error {
	m.unserved[name] = why
	return fmt.Errorf("branch %s is not served: %w", name, why)
}

// open serves the branch r and makes sure its fork point is open.
func (m *Manager) open(r record) (*View, error) {
	// Made only now, so that a path under it fails (ENOENT) rather than
	// writes into the state dir until the branch is served.
	// (It exists already after a restart, maybe as a dead mount that a
	// killed daemon left, which the host clears.)
	mnt := filepath.Join(m.stateOf(r.Name), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	v, err := m.host.OpenBranch(r.Name, m.stateOf(r.Name), mnt)
	if err != nil {
		return nil, err
	}
	for _, s := range v.Snapshots.List() {
		if overlay.IsForkScope(s.ScopeID) && s.ScopeID != overlay.ForkScope(r.Fork) {
			// A next fork point a crash stopped a merge from taking.
			v.Engine.DropSnapshot(s.ScopeID)
		}
	}
	if info, ok := v.Snapshots.Lookup(overlay.ForkScope(r.Fork)); !ok || info.Closed {
		// Made just before a crash, before its fork point was open:
		// nothing could change it in between.
		if _, err := v.Engine.OpenSnapshot(overlay.ForkScope(r.Fork), "", 0, nil); err != nil {
			v.Close()
			return nil, fmt.Errorf("open its fork point: %w", err)
		}
	}
	return &v, nil
}

// removeStrays removes the directories of branches the registry does not
// list: a fork a crash stopped before it was registered, or a drop after.
func (m *Manager) removeStrays(registered map[string]bool) {
	ents, err := os.ReadDir(m.dir())
	if err != nil {
		return
	}
	for _, d := range ents {
		if d.IsDir() && !registered[d.Name()] {
			if err := os.RemoveAll(filepath.Join(m.dir(), d.Name())); err != nil {
				m.cfg.Logf("branches: remove %s: %v", d.Name(), err)
			}
		}
	}
}

// Close stops serving every branch, children first.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.reg) - 1; i >= 0; i-- {
		if v := m.views[m.reg[i].Name]; v != nil {
			v.Close()
		}
	}
	m.views = map[string]*View{}
}

// saveLocked writes the registry durably.
func (m *Manager) saveLocked() error {
	b, err := json.MarshalIndent(m.reg, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(m.registryPath(), append(b, '\n'), 0o600); err != nil {
		return err
	}
	saved := append([]record(nil), m.reg...)
	m.saved.Store(&saved)
	return nil
}

func (m *Manager) started() error {
	if m.main == nil {
		return control.Errorf(control.CodeInvalidState, "the branches are not served yet; try again")
	}
	return nil
}

// viewLocked returns the view named name: the main view or a branch.
func (m *Manager) viewLocked(name string) (*View, error) {
	if name == "" || name == control.MainBranch {
		return m.main, nil
	}
	if v := m.views[name]; v != nil {
		return v, nil
	}
	if why := m.unserved[name]; why != nil && m.recordLocked(name) != nil {
		return nil, control.Errorf(control.CodeInvalidState, "branch %s is not served: %v (stagefs branch --drop %s removes it)", name, why, name)
	}
	return nil, control.Errorf(control.CodeNotFound, "no branch %q (stagefs branches lists them)", name)
}

func (m *Manager) recordLocked(name string) *record {
	for i := range m.reg {
		if m.reg[i].Name == name {
			return &m.reg[i]
		}
	}
	return nil
}

// relPaths turns the paths a client gave (relative to the workspace's
// root, or absolute under the workspace or one of the mount's views) into
// the engine's form.
func (m *Manager) relPaths(ps []string) ([]string, error) {
	roots := []string{m.cfg.Workspace, m.main.Mount}
	for _, v := range m.views {
		roots = append(roots, v.Mount)
	}
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		if filepath.IsAbs(p) {
			c, found := filepath.Clean(p), false
			for _, root := range roots {
				if root != "" && (c == root || strings.HasPrefix(c, root+"/")) {
					p, found = strings.TrimPrefix(strings.TrimPrefix(c, root), "/"), true
					break
				}
			}
			if !found {
				return nil, control.Errorf(control.CodePathOutsideWorkspace, "%s is outside the workspace and the mount's views", p)
			}
			if p == "" {
				p = "."
			}
		}
		rel, err := overlay.CleanPath(p)
		if err != nil {
			return nil, control.Errorf(control.CodePathOutsideWorkspace, "%s: %v", p, err)
		}
		out = append(out, rel)
	}
	return out, nil
}

// CreateBranch forks p.Name from p.From (the main view by default). It
// answers at the fork's instant: the copy of the parent's pending set
// goes on after, while the parent changes (pushing into the copy what it
// is about to change first), holding this manager's lock so that every
// use of a branch waits for it. The branch is registered durably and
// served once its copy is durable; a crash before that leaves nothing of
// it (its directory is removed at the next start).
func (m *Manager) CreateBranch(ctx context.Context, p control.BranchParams) (control.BranchInfo, error) {
	m.mu.Lock()
	handedOver := false
	defer func() {
		if !handedOver {
			m.mu.Unlock()
		}
	}()
	if err := m.started(); err != nil {
		return control.BranchInfo{}, err
	}
	if m.recordLocked(p.Name) != nil {
		return control.BranchInfo{}, control.Errorf(control.CodeInvalidState, "branch %s exists already", p.Name)
	}
	parent, err := m.viewLocked(p.From)
	if err != nil {
		return control.BranchInfo{}, err
	}
	r := record{Name: p.Name, Parent: p.From, ForkedAt: time.Now().UnixNano()}
	if r.Parent == "" {
		r.Parent = control.MainBranch
	}
	state := m.stateOf(r.Name)
	if err := os.RemoveAll(state); err != nil { // a stray a crash left
		return control.BranchInfo{}, err
	}
	fk, err := parent.Engine.Fork(state)
	if err != nil {
		os.RemoveAll(state)
		return control.BranchInfo{}, control.Errorf(control.CodeInvalidState, "fork %s: %v", r.Parent, err)
	}
	delete(m.unserved, r.Name)
	m.reg = append(m.reg, r)
	// Listed from now on, as being forked, though the registry is
	// written only when the copy is durable.
	listed := append([]record(nil), m.reg...)
	listed[len(listed)-1].forking = true
	m.saved.Store(&listed)
	handedOver = true
	go m.finishFork(fk, r)
	return m.pathsOf(r), nil
}

// finishFork copies the fork fk of r, registers it durably and serves it,
// holding m.mu (handed over by CreateBranch, let go of here).
func (m *Manager) finishFork(fk *overlay.ForkCopy, r record) {
	defer m.mu.Unlock()
	// A bug here must not take the daemon, its mounts and every other
	// view down with it, as it could not when the fork ran in the
	// control request.
	defer func() {
		if v := recover(); v != nil {
			m.forkFailed(r, fmt.Errorf("%v", v))
		}
	}()
	if m.forkedHook != nil {
		m.forkedHook()
	}
	err := fk.Run()
	if err == nil {
		err = m.saveLocked()
	}
	if err != nil {
		m.forkFailed(r, err)
		return
	}
	v, err := m.open(r)
	if err != nil {
		// Registered: the next start serves it, or says why not.
		m.cfg.Logf("%v", m.notServedLocked(r.Name, err))
		return
	}
	m.views[r.Name] = v
}

// forkFailed removes the branch r whose fork answered but could not be
// finished: the registry never listed it. stagefs branch, waiting for it
// to be served, says so, and the log says why.
func (m *Manager) forkFailed(r record, err error) {
	m.cfg.Logf("branches: the fork of %s failed: %v; it is removed", r.Name, err)
	m.reg = slices.DeleteFunc(m.reg, func(x record) bool { return x.Name == r.Name })
	listed := append([]record(nil), m.reg...)
	m.saved.Store(&listed)
	m.removeStateDir(r.Name)
}

// removeLocked unregisters the branch name and removes its state dir.
func (m *Manager) removeLocked(name string) error {
	m.reg = slices.DeleteFunc(m.reg, func(x record) bool { return x.Name == name })
	if err := m.saveLocked(); err != nil {
		return err
	}
	m.removeStateDir(name)
	return nil
}

// removeStateDir removes the state dir of a branch the registry no longer
// lists; what it cannot remove goes at the next start (removeStrays).
func (m *Manager) removeStateDir(name string) {
	if err := os.RemoveAll(m.stateOf(name)); err != nil {
		m.cfg.Logf("branches: remove %s: %v (removed at the next start)", name, err)
	}
}

// DropBranch stops serving a branch and removes it with its pending set.
func (m *Manager) DropBranch(ctx context.Context, p control.BranchParams) (control.BranchInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.started(); err != nil {
		return control.BranchInfo{}, err
	}
	r := m.recordLocked(p.Name)
	if r == nil {
		return control.BranchInfo{}, control.Errorf(control.CodeNotFound, "no branch %q (stagefs branches lists them)", p.Name)
	}
	for _, c := range m.reg {
		if c.Parent == p.Name {
			return control.BranchInfo{}, control.Errorf(control.CodeInvalidState, "branch %s has a branch of its own, %s: drop that first", p.Name, c.Name)
		}
	}
	info := m.infoLocked(*r)
	if v := m.views[p.Name]; v != nil {
		if v.InUse != nil && v.InUse() {
			return info, control.Errorf(control.CodeBusy, "branch %s is in use: a stagefs run, agent command or acp proxy works in it; drop it once that has ended", p.Name)
		}
		if v.Unmount != nil {
			if err := v.Unmount(); err != nil {
				return info, control.Errorf(control.CodeBusy, "branch %s is in use: its mount %s is busy (%v): a process has a file or its working directory there", p.Name, v.Mount, err)
			}
		}
		v.Close()
		delete(m.views, p.Name)
	}
	delete(m.unserved, p.Name)
	return info, m.removeLocked(p.Name)
}

// ListBranches lists the branches, oldest first. Unlike Infos it waits
// for a fork, drop or merge that runs: a client that asks for a branch it
// just forked gets it served.
func (m *Manager) ListBranches(ctx context.Context) (control.ListBranchesResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := control.ListBranchesResult{Branches: []control.BranchInfo{}}
	if err := m.started(); err != nil {
		return res, err
	}
	for _, r := range m.reg {
		res.Branches = append(res.Branches, m.infoLocked(r))
	}
	res.MainMount, res.MainSocket = m.main.Mount, m.main.Socket
	return res, nil
}

// Infos describes every branch, oldest first. While a fork, drop or merge
// runs it does not wait: it answers from the registry as it was last
// saved, without the pending counts.
func (m *Manager) Infos() []control.BranchInfo {
	out := []control.BranchInfo{}
	if !m.mu.TryLock() {
		for _, r := range *m.saved.Load() {
			out = append(out, m.pathsOf(r))
		}
		return out
	}
	defer m.mu.Unlock()
	for _, r := range m.reg {
		out = append(out, m.infoLocked(r))
	}
	return out
}

// pathsOf describes r without its pending counts, as it is or will be
// served.
func (m *Manager) pathsOf(r record) control.BranchInfo {
	if r.forking {
		return control.BranchInfo{Name: r.Name, Parent: r.Parent, ForkedAt: r.ForkedAt, NotServed: "its fork is being copied (branch/list waits for it)"}
	}
	return control.BranchInfo{Name: r.Name, Parent: r.Parent, ForkedAt: r.ForkedAt,
		Mount: filepath.Join(m.stateOf(r.Name), "mnt"), Socket: filepath.Join(m.stateOf(r.Name), "control.sock")}
}

func (m *Manager) infoLocked(r record) control.BranchInfo {
	info := control.BranchInfo{Name: r.Name, Parent: r.Parent, ForkedAt: r.ForkedAt}
	if v := m.views[r.Name]; v != nil {
		info.Mount, info.Socket = v.Mount, v.Socket
		for _, c := range v.Engine.Pending(nil) {
			info.Pending++
			info.PendingBytes += c.Bytes
		}
	} else if why := m.unserved[r.Name]; why != nil {
		info.NotServed = why.Error()
	}
	return info
}

package main

// The daemon's side of the hook channel (control/hooks.go): the agents'
// hooks start turns and bracket tool calls with snapshots through it, and
// nothing else. It lives beside the control socket but on a socket of its
// own, reachable inside the sandbox, where the control socket is not.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/snapshot"
)

// hookChannel keeps what the hooks of agents' sessions have started.
//
// Lock order: mu before the engine's locks (it calls the engine with mu
// held, so that a start and an end of one tool call cannot cross).
type hookChannel struct {
	b    *backend
	logf func(format string, args ...any)

	mu sync.Mutex
	// prepared holds tool calls whose snapshot opens when their command
	// binds it (HookToolCallStartParams.Bind): scope → label.
	prepared map[string]string
	// sessions: per agent session, the tool calls in start order that have
	// not ended, and the counter that names those the agent gives no id.
	sessions map[string]*hookSession
	// bound: the pidfd of the process each bound tool call follows.
	bound map[string]int
}

type hookSession struct {
	next int
	open []string
}

func newHookChannel(b *backend, logf func(string, ...any)) *hookChannel {
	return &hookChannel{b: b, logf: logf, prepared: map[string]string{}, sessions: map[string]*hookSession{}, bound: map[string]int{}}
}

// serve listens on the hook channel's abstract socket and answers the hook
// methods there until the server is closed.
func (h *hookChannel) serve(name string) (*control.Server, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("hook channel %s: %w", name, err)
	}
	s := control.NewServer(nil, control.ServerOptions{Logf: h.logf, MaxLineBytes: 1 << 20})
	s.Handle(control.MethodHookTurn, control.Typed(h.turn))
	s.Handle(control.MethodHookToolCallStart, control.Typed(h.start))
	s.Handle(control.MethodHookToolCallBind, control.Typed(h.bind))
	s.Handle(control.MethodHookToolCallEnd, control.Typed(h.end))
	s.Handle(control.MethodHookSessionEnd, control.Typed(h.sessionEnd))
	go s.Serve(l)
	return s, nil
}

func (h *hookChannel) session(id string) *hookSession {
	s := h.sessions[id]
	if s == nil {
		s = &hookSession{}
		h.sessions[id] = s
	}
	return s
}

func (h *hookChannel) turn(ctx context.Context, p control.HookTurnParams) (control.TurnInfo, error) {
	// An agent may submit more than once under one prompt's id (Claude
	// Code reports a background command's end as a prompt with the id of
	// the prompt that started it): that prompt's turn goes on, and is
	// not started again, which would drop what it captured.
	if p.TurnID != "" {
		for _, t := range h.b.eng.Turns() {
			if t.ID == p.TurnID {
				return turnInfo(t), nil
			}
		}
	}
	return h.b.turn(ctx, control.TurnParams{TurnID: p.TurnID, Label: p.Label})
}

func (h *hookChannel) start(ctx context.Context, p control.HookToolCallStartParams) (control.HookToolCallStartResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sess := h.session(p.SessionID)
	scope := p.ScopeID
	for scope == "" {
		// An agent whose hooks carry no tool call id (Gemini CLI): the
		// session's own numbered ids, paired with the ends in order. A
		// number a snapshot holds already (the daemon restarted) is
		// skipped: reusing it would replace that snapshot.
		sess.next++
		scope = fmt.Sprintf("%s-%d", scopeSafe(p.SessionID), sess.next)
		if _, taken := h.b.snaps.Lookup(scope); taken {
			scope = ""
		}
	}
	if err := checkScope(scope); err != nil {
		return control.HookToolCallStartResult{}, err
	}
	if err := h.b.checkScopeUnused(scope); err != nil {
		return control.HookToolCallStartResult{}, err
	}
	if _, ok := h.prepared[scope]; ok {
		return control.HookToolCallStartResult{}, control.Errorf(control.CodeBusy, "tool call %q has started already", scope)
	}
	if p.Bind {
		h.prepared[scope] = shortLabel(p.Label)
	} else if _, err := h.b.eng.OpenLabeledSnapshot(scope, h.b.eng.CurrentTurn(), shortLabel(p.Label), 0, nil); err != nil {
		return control.HookToolCallStartResult{}, snapshotError(scope, err)
	}
	sess.open = append(sess.open, scope)
	return control.HookToolCallStartResult{ScopeID: scope}, nil
}

func (h *hookChannel) bind(ctx context.Context, p control.HookToolCallBindParams) (control.HookToolCallBindResult, error) {
	peer, ok := control.PeerFrom(ctx)
	if !ok || peer.Pid <= 0 {
		return control.HookToolCallBindResult{}, errors.New("the caller's process is unknown")
	}
	shell, err := parentPid(peer.Pid)
	if err != nil {
		return control.HookToolCallBindResult{}, fmt.Errorf("the caller's parent: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	label, ok := h.prepared[p.ScopeID]
	if !ok {
		return control.HookToolCallBindResult{}, control.Errorf(control.CodeNotFound, "no tool call %q is waiting for its command", p.ScopeID)
	}
	delete(h.prepared, p.ScopeID)
	if _, err := h.b.eng.OpenLabeledSnapshot(p.ScopeID, h.b.eng.CurrentTurn(), label, shell, nil); err != nil {
		return control.HookToolCallBindResult{}, snapshotError(p.ScopeID, err)
	}
	// The pidfd says when the command's shell has gone, even after its pid
	// is reused. Without one (an old kernel) the snapshot closes at the
	// tool call's end.
	if fd, err := unix.PidfdOpen(shell, 0); err == nil {
		h.bound[p.ScopeID] = fd
	}
	return control.HookToolCallBindResult{ScopeID: p.ScopeID, Pid: shell}, nil
}

func (h *hookChannel) end(ctx context.Context, p control.HookToolCallEndParams) (control.HookToolCallEndResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.endLocked(p.SessionID, p.ScopeID)
}

// endLocked ends the tool call scope, or the session's oldest open one.
func (h *hookChannel) endLocked(session, scope string) (control.HookToolCallEndResult, error) {
	sess := h.session(session)
	if scope == "" {
		if len(sess.open) == 0 {
			return control.HookToolCallEndResult{}, control.Errorf(control.CodeNotFound, "session %q has no tool call open", session)
		}
		scope = sess.open[0]
	}
	for i, s := range sess.open {
		if s == scope {
			sess.open = append(sess.open[:i:i], sess.open[i+1:]...)
			break
		}
	}
	if _, ok := h.prepared[scope]; ok {
		// Its command never bound it (it did not run): nothing opened.
		delete(h.prepared, scope)
		return control.HookToolCallEndResult{ScopeID: scope}, nil
	}
	if fd, ok := h.bound[scope]; ok {
		delete(h.bound, scope)
		if running(fd) {
			// A command left running in the background: its snapshot
			// stays open, covering it alone, until it exits.
			go h.closeAtExit(scope, fd)
			return control.HookToolCallEndResult{ScopeID: scope, Deferred: true}, nil
		}
		unix.Close(fd)
	}
	if _, err := h.b.eng.CloseSnapshot(scope); err != nil && !errors.Is(err, snapshot.ErrClosed) {
		return control.HookToolCallEndResult{}, snapshotError(scope, err)
	}
	return control.HookToolCallEndResult{ScopeID: scope}, nil
}

func (h *hookChannel) sessionEnd(ctx context.Context, p control.HookSessionEndParams) (control.HookSessionEndResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	res := control.HookSessionEndResult{Closed: []string{}}
	sess := h.session(p.SessionID)
	for len(sess.open) > 0 {
		r, err := h.endLocked(p.SessionID, sess.open[0])
		if err != nil {
			return res, err
		}
		res.Closed = append(res.Closed, r.ScopeID)
	}
	// The session's counter stays: an agent may end a prompt this way
	// (Gemini CLI's AfterAgent) and go on numbering its tool calls.
	return res, nil
}

// closeAtExit closes scope's snapshot once the process behind fd exits.
func (h *hookChannel) closeAtExit(scope string, fd int) {
	defer unix.Close(fd)
	for {
		_, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, -1)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if _, err := h.b.eng.CloseSnapshot(scope); err != nil && !errors.Is(err, snapshot.ErrClosed) && !errors.Is(err, snapshot.ErrNotFound) {
		h.logf("hook channel: closing %s after its command exited: %v", scope, err)
	}
}

// running reports whether the process behind pidfd fd has not exited.
func running(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 0
}

// parentPid reads a process's parent from /proc/PID/stat.
func parentPid(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// PID (COMM) STATE PPID ...: COMM may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	return strconv.Atoi(f[1])
}

// scopeSafe keeps the bytes a scope id may hold, and at most 40 of them.
func scopeSafe(s string) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 40; i++ {
		if snapshot.ValidScope(string(s[i])) == nil {
			b.WriteByte(s[i])
		}
	}
	if b.Len() == 0 {
		return "session"
	}
	return b.String()
}

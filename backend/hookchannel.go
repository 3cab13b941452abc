package backend

// The daemon's side of the hook channel (control/hooks.go): the agents'
// hooks start turns and bracket tool calls with snapshots through it, and
// nothing else. It lives beside the control socket but on a socket of its
// own, reachable inside the sandbox, where the control socket is not.
//
// Everything inside the sandbox can reach it, the model's own commands
// included, so it acts only on what it started itself (never on a turn's
// snapshot, a host's or another proxy's), and bounds what it keeps.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"stagefs/control"
	"stagefs/snapshot"
)

// Bounds on what the hook channel keeps: a tool call that floods it gets
// errors, and the daemon stays up.
const (
	maxHookScopes   = 512 // tool calls started and not yet closed (or waiting for their command to exit)
	maxHookSessions = 256 // agent sessions with a counter
)

// bindGrace is how long a shell tool call whose end came before its
// command started may still bind its snapshot.
const bindGrace = time.Minute

// hookScope is one tool call the hook channel started.
type hookScope struct {
	session  string
	label    string
	prepared bool     // waiting for its command to bind it (not opened yet)
	bound    *os.File // the pidfd of the shell it follows, once bound
	ending   bool     // its end came while the shell still ran: closes at its exit
}

// HookChannel answers the hook channel's methods (control.HookBackend)
// and keeps what the hooks of agents' sessions have started.
//
// Lock order: mu before the engine's locks (it calls the engine with mu
// held, so that a start and an end of one tool call cannot cross).
type HookChannel struct {
	b    *Backend
	logf func(format string, args ...any)

	mu     sync.Mutex
	scopes map[string]*hookScope // by scope id: every tool call not closed yet
	// sessions: per agent session, the tool calls in start order that have
	// not ended, and the counter that names those the agent gives no id.
	sessions map[string]*hookSession
}

type hookSession struct {
	next int
	open []string
}

var _ control.HookBackend = (*HookChannel)(nil)

// NewHookChannel returns the hook channel's side of b; logf gets what goes
// wrong with no client to tell.
func NewHookChannel(b *Backend, logf func(string, ...any)) *HookChannel {
	return &HookChannel{b: b, logf: logf, scopes: map[string]*hookScope{}, sessions: map[string]*hookSession{}}
}

// session returns the session's state, making it when there is room.
func (h *HookChannel) session(id string) (*hookSession, error) {
	s := h.sessions[id]
	if s == nil {
		if len(h.sessions) >= maxHookSessions {
			return nil, control.Errorf(control.CodeBusy, "the hook channel keeps at most %d agent sessions", maxHookSessions)
		}
		s = &hookSession{}
		h.sessions[id] = s
	}
	return s, nil
}

func (h *HookChannel) HookTurn(ctx context.Context, p control.HookTurnParams) (control.TurnInfo, error) {
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
	return h.b.Turn(ctx, control.TurnParams{TurnID: p.TurnID, Label: p.Label})
}

func (h *HookChannel) HookToolCallStart(ctx context.Context, p control.HookToolCallStartParams) (control.HookToolCallStartResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.scopes) >= maxHookScopes {
		return control.HookToolCallStartResult{}, control.Errorf(control.CodeBusy, "the hook channel has %d tool calls open; end some first", len(h.scopes))
	}
	sess, err := h.session(p.SessionID)
	if err != nil {
		return control.HookToolCallStartResult{}, err
	}
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
	if h.scopes[scope] != nil {
		return control.HookToolCallStartResult{}, control.Errorf(control.CodeBusy, "tool call %q has started already", scope)
	}
	if err := h.b.checkScopeUnused(scope); err != nil {
		return control.HookToolCallStartResult{}, err
	}
	hs := &hookScope{session: p.SessionID, label: shortLabel(p.Label), prepared: p.Bind}
	if !p.Bind {
		// One unbound tool call per session at a time: a previous one
		// whose end never came (a failed hook) stops here, as a host's
		// would when it opens the next. Other sessions' and other
		// clients' snapshots stay open.
		for _, id := range sess.open {
			if o := h.scopes[id]; o != nil && !o.prepared && o.bound == nil && !o.ending {
				h.closeLocked(id)
			}
		}
		if _, err := h.b.eng.OpenSnapshotBeside(scope, h.b.eng.CurrentTurn(), hs.label); err != nil {
			return control.HookToolCallStartResult{}, snapshotError(scope, err)
		}
	}
	h.scopes[scope] = hs
	sess.open = append(sess.open, scope)
	return control.HookToolCallStartResult{ScopeID: scope}, nil
}

func (h *HookChannel) HookToolCallBind(ctx context.Context, scopeID string) (control.HookToolCallBindResult, error) {
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
	hs := h.scopes[scopeID]
	if hs == nil || !hs.prepared {
		return control.HookToolCallBindResult{}, control.Errorf(control.CodeNotFound, "no tool call %q is waiting for its command", scopeID)
	}
	if _, err := h.b.eng.OpenLabeledSnapshot(scopeID, h.b.eng.CurrentTurn(), hs.label, shell, nil); err != nil {
		return control.HookToolCallBindResult{}, snapshotError(scopeID, err)
	}
	hs.prepared = false
	// The pidfd says when the command's shell has gone, even after its pid
	// is reused; non-blocking, so the runtime's poller waits on it, not a
	// thread. Without one (an old kernel) the snapshot closes at the tool
	// call's end.
	if fd, err := unix.PidfdOpen(shell, unix.PIDFD_NONBLOCK); err == nil {
		hs.bound = os.NewFile(uintptr(fd), "pidfd "+strconv.Itoa(shell))
	}
	if hs.ending {
		// The tool call's end came first (a command the agent runs in the
		// background is reported started at once): it follows its shell
		// from here, or stops now if it cannot.
		if hs.bound != nil {
			go h.closeAtExit(scopeID, hs.bound)
		} else {
			h.closeLocked(scopeID)
		}
	}
	return control.HookToolCallBindResult{ScopeID: scopeID, Pid: shell}, nil
}

func (h *HookChannel) HookToolCallEnd(ctx context.Context, p control.HookToolCallEndParams) (control.HookToolCallEndResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.endLocked(p.SessionID, p.ScopeID)
}

// endLocked ends the tool call scope, or the session's oldest open one.
// Only tool calls this channel started are ended.
func (h *HookChannel) endLocked(session, scope string) (control.HookToolCallEndResult, error) {
	if scope == "" {
		sess := h.sessions[session]
		if sess == nil || len(sess.open) == 0 {
			return control.HookToolCallEndResult{}, control.Errorf(control.CodeNotFound, "session %q has no tool call open", session)
		}
		scope = sess.open[0]
	}
	hs := h.scopes[scope]
	if hs == nil || hs.ending {
		return control.HookToolCallEndResult{}, control.Errorf(control.CodeNotFound, "no tool call %q was started through the hook channel", scope)
	}
	if hs.prepared {
		// Its command has not bound it yet: a command in the background
		// may still be on its way. It gets a while to; a command that
		// never ran is forgotten then.
		hs.ending = true
		h.forget(hs.session, scope)
		time.AfterFunc(bindGrace, func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if o := h.scopes[scope]; o == hs && o.prepared {
				h.closeLocked(scope)
			}
		})
		return control.HookToolCallEndResult{ScopeID: scope, Deferred: true}, nil
	}
	if hs.bound != nil && running(hs.bound) {
		// A command left running in the background: its snapshot stays
		// open, covering it alone, until its shell exits.
		hs.ending = true
		h.forget(hs.session, scope)
		go h.closeAtExit(scope, hs.bound)
		return control.HookToolCallEndResult{ScopeID: scope, Deferred: true}, nil
	}
	if err := h.closeLocked(scope); err != nil {
		return control.HookToolCallEndResult{}, err
	}
	return control.HookToolCallEndResult{ScopeID: scope}, nil
}

// closeLocked closes a tool call's snapshot now (a prepared one never
// opened) and forgets it.
func (h *HookChannel) closeLocked(scope string) error {
	hs := h.scopes[scope]
	delete(h.scopes, scope)
	h.forget(hs.session, scope)
	if hs.bound != nil {
		hs.bound.Close()
	}
	if hs.prepared {
		return nil // its command never bound it (it did not run)
	}
	if _, err := h.b.eng.CloseSnapshot(scope); err != nil && !errors.Is(err, snapshot.ErrClosed) && !errors.Is(err, snapshot.ErrNotFound) {
		return snapshotError(scope, err)
	}
	return nil
}

// forget takes scope off its session's list of open tool calls.
func (h *HookChannel) forget(session, scope string) {
	sess := h.sessions[session]
	if sess == nil {
		return
	}
	for i, s := range sess.open {
		if s == scope {
			sess.open = append(sess.open[:i:i], sess.open[i+1:]...)
			return
		}
	}
}

func (h *HookChannel) HookSessionEnd(ctx context.Context, sessionID string) (control.HookSessionEndResult, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	res := control.HookSessionEndResult{Closed: []string{}}
	sess := h.sessions[sessionID]
	for sess != nil && len(sess.open) > 0 {
		r, err := h.endLocked(sessionID, sess.open[0])
		if err != nil {
			return res, err
		}
		res.Closed = append(res.Closed, r.ScopeID)
	}
	// The session's counter stays: an agent may end a prompt this way
	// (Gemini CLI's AfterAgent) and go on numbering its tool calls.
	return res, nil
}

// closeAtExit closes scope's snapshot once the process behind pidfd exits.
func (h *HookChannel) closeAtExit(scope string, pidfd *os.File) {
	if rc, err := pidfd.SyscallConn(); err == nil {
		// Read waits in the runtime's poller until the pidfd is readable,
		// which it is once the process has exited.
		rc.Read(func(fd uintptr) bool { return !runningFd(int(fd)) })
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.closeLocked(scope); err != nil {
		h.logf("hook channel: closing %s after its command exited: %v", scope, err)
	}
}

// running reports whether the process behind a pidfd has not exited.
func running(pidfd *os.File) bool {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	rc.Control(func(fd uintptr) { alive = runningFd(int(fd)) })
	return alive
}

func runningFd(fd int) bool {
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

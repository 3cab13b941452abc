package test

import (
	"path/filepath"
	"strings"
	"testing"
)

// terminalProbe makes a pty its controlling terminal in a new session and
// tries to push a byte into its input (TIOCSTI), printing "injected" or
// "refused ERRNO".
const terminalProbe = `import os, pty, fcntl, termios
pid = os.fork()
if pid == 0:
    os.setsid()
    m, s = pty.openpty()
    fcntl.ioctl(s, termios.TIOCSCTTY, 0)
    try:
        fcntl.ioctl(s, termios.TIOCSTI, b"x")
        print("injected")
    except OSError as e:
        print("refused", e.errno)
    os._exit(0)
os.waitpid(pid, 0)
`

// ipcProbe looks for the System V shared memory segment with key K: "seen"
// or "absent".
const ipcProbe = `import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
print("seen" if libc.shmget(int(sys.argv[1]), 0, 0) >= 0 else "absent")
`

// A command in stagefs run cannot push input into a terminal that the
// caller's shell would read and run after it, outside the namespace
// (TIOCSTI; the sandbox's seccomp filter refuses it with EPERM), and it
// does not share the host's System V and POSIX IPC objects (an IPC
// namespace of its own).
func TestRunCannotInjectTerminalInputOrReachHostIPC(t *testing.T) {
	parallel(t)
	requireTool(t, "python3")
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	outside := mustRun(t, cmdSpec{}, "python3", "-c", terminalProbe)
	t.Logf("TIOCSTI outside the sandbox: %s", strings.TrimSpace(outside))
	if r := m.run(m.ws, "--", "python3", "-c", terminalProbe); r.code != 0 || r.stdout != "refused 1\n" {
		t.Errorf("TIOCSTI in stagefs run: want refused with EPERM: %s", r)
	}

	const key = "1752526389"
	seg := mustRun(t, cmdSpec{}, "python3", "-c", `import ctypes; libc = ctypes.CDLL(None, use_errno=True); print(libc.shmget(`+key+`, 4096, 0o1600))`)
	defer runIn(t, cmdSpec{}, "python3", "-c", `import ctypes; libc = ctypes.CDLL(None); libc.shmctl(`+strings.TrimSpace(seg)+`, 0, None)`)
	if got := mustRun(t, cmdSpec{}, "python3", "-c", ipcProbe, key); got != "seen\n" {
		t.Fatalf("the segment made outside is not seen outside: %q", got)
	}
	if r := m.run(m.ws, "--", "python3", "-c", ipcProbe, key); r.code != 0 || r.stdout != "absent\n" {
		t.Errorf("the host's shared memory segment in stagefs run: %s", r)
	}
}

// A symlink a command leaves at the state dir's path in the run's private
// /tmp (kept between runs) must not move where the next run hides the
// state dir: its tmpfs once went over the workspace the link named, and
// every later run saw an empty, read-only workspace.
func TestRunIgnoresALinkAtTheStatePath(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	if r := m.run(m.ws, "--", "sh", "-c", "test -e "+m.state+" && echo seen || echo hidden"); r.stdout != "hidden\n" {
		t.Skipf("the state dir is not under the run's private /tmp here: %s", r)
	}
	if r := m.run(m.ws, "--", "sh", "-c", "mkdir -p "+filepath.Dir(m.state)+" && ln -s "+m.ws+" "+m.state); r.code != 0 {
		t.Fatal(r)
	}
	if r := m.run(m.ws, "--", "sh", "-c", "cat f.txt && touch made"); r.code != 0 || r.stdout != "f\n" {
		t.Fatalf("the run after the link: %s", r)
	}
	if kinds := statusKinds(m.status()); kinds["made"] != "create" {
		t.Errorf("pending: %v", kinds)
	}
}

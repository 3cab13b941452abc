package test

// The ways a command might try to get out of stagefs run to the real
// workspace, the state dir or the daemon, as root and as an ordinary user.
// Each must fail, and neither the workspace nor the state dir may change
// by a byte.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// escapeFinder prints the pids of the processes whose command line names
// the daemon's subcommand, found by scanning /proc. The pattern is split
// so that the script's own command line does not match it.
const escapeFinder = `PAT="__dae""mon"; found=""
for c in /proc/[0-9]*/cmdline; do
  case "$(tr '\0' ' ' < "$c" 2>/dev/null)" in *"$PAT"*) p=${c#/proc/}; found="$found ${p%/cmdline}";; esac
done
`

// escapeProbe tries every way out; it prints a line in capitals for each
// one that worked, and DONE at the end. Arguments: workspace, state dir,
// daemon pid, stagefs binary, a scratch directory outside the workspace.
const escapeProbe = `WS=$1 S=$2 D=$3 B=$4 SCRATCH=$5
` + escapeFinder + `
for p in $D $found; do
  [ -d /proc/$p ] && [ "$p" != 1 ] && [ "$p" != $$ ] || continue
  echo "SEES $p $(tr '\0' ' ' < /proc/$p/cmdline)"
  for fd in /proc/$p/fd/*; do
    [ -d "$fd" ] && (echo escaped > "$fd/escaped.txt") 2>/dev/null && echo "WROTE-THROUGH $fd"
  done
  (echo escaped > "/proc/$p/root$WS/escaped.txt") 2>/dev/null && echo "WROTE-THROUGH-ROOT $p"
  (echo escaped > "/proc/$p/root$S/escaped.txt") 2>/dev/null && echo "WROTE-STATE-THROUGH-ROOT $p"
  kill -9 $p 2>/dev/null && echo "KILLED $p"
done
kill -9 $D 2>/dev/null && echo "KILLED-BY-PID $D"
for task in /proc/1/task/*; do
  (exec 3<>"$task/mem") 2>/dev/null && echo "INIT-MEMORY-OPEN $task"
done
for fd in /proc/1/fd/*; do
  (exec 3<"$fd") 2>/dev/null && echo "INIT-FD-OPEN $fd"
done
ls /proc/1/root/ >/dev/null 2>&1 && echo INIT-ROOT-READABLE
nsenter --mount=/proc/$D/ns/mnt -- sh -c "echo escaped > '$WS/escaped.txt'" 2>/dev/null && echo "NSENTER-DAEMON"
nsenter -t 1 -m -- sh -c "umount -l '$WS' && echo escaped > '$WS/escaped.txt'" 2>/dev/null && echo NSENTER-INIT
umount "$WS" 2>/dev/null && echo UMOUNTED
umount -l "$WS" 2>/dev/null && echo UMOUNTED-LAZY
mount --bind "$SCRATCH" "$WS" 2>/dev/null && echo BIND-MOUNTED
mount -t tmpfs escape "$WS" 2>/dev/null && echo TMPFS-MOUNTED
umount -l "$S" 2>/dev/null && echo STATE-UNCOVERED
unshare -Urm sh -c "umount -l '$WS' && echo escaped > '$WS/escaped.txt'" 2>/dev/null && echo NESTED-UMOUNT
for sock in "$S/control.sock" "/proc/$D/root$S/control.sock"; do
  "$B" status --socket "$sock" >/dev/null 2>&1 && echo "DIALED $sock"
done
"$B" status >/dev/null 2>&1 && echo DIALED-BY-MOUNT
grep -q '^NoNewPrivs:[[:space:]]*1' /proc/self/status || echo NEW-PRIVS-ALLOWED
for set in CapEff CapPrm CapBnd CapAmb CapInh; do
  v=$(sed -n "s/^$set:[[:space:]]*//p" /proc/self/status)
  [ $(( 0x$v >> 21 & 1 )) = 1 ] && echo "HAS-SYS-ADMIN $set"
  [ $(( 0x$v >> 19 & 1 )) = 1 ] && echo "HAS-SYS-PTRACE $set"
done
echo DONE
`

// ownWork is what a command may still do inside: write and delete in the
// staged view, git, a C build.
const ownWork = `set -e
echo more >> f.txt
rm sub/g.txt
git init -q repo
echo x > repo/a.txt
git -C repo add a.txt
git -C repo commit -qm one
git -C repo log --oneline | grep -q one
printf 'int main(void){return 0;}\n' > prog.c
cc -o prog prog.c
./prog
echo OK`

// checkEscapes runs the probe inside run (through runInside) and checks
// that nothing got out and nothing changed.
func checkEscapes(t *testing.T, runInside func(dir string, args ...string) result, runOutside func(dir, name string, args ...string) result,
	ws, state, daemon, bin, scratch string) {
	t.Helper()
	// The daemon logs its last start-up line just after the mount is
	// ready; after that it writes nothing unless asked.
	waitFor(10*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(state, "daemon.log"))
		return strings.Contains(string(b), "serving ")
	})
	// The scratch layer (STATE/scratch) is the command's to write: it is
	// where its writes under $HOME and /tmp go. The rest of the state dir
	// must not change.
	wsBefore, stateBefore := snapshot(t, ws), snapshot(t, state, "scratch")
	// The scan is not vacuous: outside, it finds the daemon.
	if r := runOutside("", "sh", "-c", escapeFinder+`echo $found`); !strings.Contains(" "+r.stdout, " "+daemon+" ") && !strings.Contains(" "+r.stdout, " "+daemon+"\n") {
		t.Errorf("outside run, scanning /proc does not find the daemon %s: %s", daemon, r)
	}
	r := runInside(ws, "--", "sh", "-c", escapeProbe, "sh", ws, state, daemon, bin, scratch)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "DONE" {
		t.Errorf("ways out of stagefs run that worked (each line but DONE):\n%s", r)
	}
	assertSameTree(t, "the real workspace after the probe", wsBefore, snapshot(t, ws))
	assertSameTree(t, "the state dir after the probe", stateBefore, snapshot(t, state, "scratch"))
	pid, _ := strconv.Atoi(daemon)
	if processGone(pid) {
		t.Fatalf("the daemon %s is gone after the probe", daemon)
	}

	// The command's own work still works, and still only in the view.
	r = runInside(ws, "--", "sh", "-c", ownWork)
	if r.code != 0 || !strings.HasSuffix(r.stdout, "OK\n") {
		t.Errorf("a command's own work inside run: %s", r)
	}
	assertSameTree(t, "the real workspace after the command's own work", wsBefore, snapshot(t, ws))
}

func TestRunCannotEscapeAsRoot(t *testing.T) {
	parallel(t)
	if os.Geteuid() != 0 {
		t.Skip("runs as root; TestRunCannotEscapeUnprivileged covers other users")
	}
	requireTool(t, "nsenter")
	requireTool(t, "unshare")
	requireTool(t, "cc")
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "one\n", "sub/g.txt": "g\n"}))
	scratch := filepath.Join(m.base, "scratch")
	os.Mkdir(scratch, 0o755)
	outside := func(dir, name string, args ...string) result { return runIn(t, cmdSpec{dir: dir}, name, args...) }
	checkEscapes(t, m.run, outside, m.ws, m.state, strconv.Itoa(m.daemonPid()), stagefsBin, scratch)

	kinds := statusKinds(m.status())
	if kinds["f.txt"] != "write" || kinds["sub/g.txt"] != "delete" || kinds["repo/a.txt"] != "create" || kinds["prog"] != "create" {
		t.Errorf("pending after the command's own work: %v", kinds)
	}
	// Root inside still owns its files: chown in the staged view works.
	if r := m.run(m.ws, "--", "sh", "-c", "chown 1234:1234 f.txt && stat -c %u:%g f.txt"); r.code != 0 || r.stdout != "1234:1234\n" {
		t.Errorf("chown inside run as root: %s", r)
	}
}

func TestRunCannotEscapeUnprivileged(t *testing.T) {
	parallel(t)
	requireTool(t, "cc")
	u := startUserMount(t, map[string]string{"f.txt": "one\n", "sub/g.txt": "g\n"})
	scratch := filepath.Join(u.base, "scratch")
	os.Mkdir(scratch, 0o777)
	env := "HOME=" + u.base // git and cc want somewhere to write
	inside := func(dir string, args ...string) result {
		return u.as(dir, "env", append([]string{env, u.bin, "run", "-m", u.mnt}, args...)...)
	}
	outside := func(dir, name string, args ...string) result { return u.as(dir, name, args...) }
	checkEscapes(t, inside, outside, u.ws, u.state, strconv.Itoa(u.daemonPid()), u.bin, scratch)
	kinds := statusKinds(u.userStatus())
	if kinds["f.txt"] != "write" || kinds["sub/g.txt"] != "delete" || kinds["repo/a.txt"] != "create" || kinds["prog"] != "create" {
		t.Errorf("pending after the command's own work: %v", kinds)
	}
}

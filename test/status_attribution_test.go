package test

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"stagefs/control"
)

// runPid runs a command in dir, fails the test unless it exits 0, and
// returns its pid.
func runPid(t *testing.T, dir, stdin, name string, args ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = baseEnv()
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return cmd.Process.Pid
}

// statusEntry returns the status entry of p.
func statusEntry(t *testing.T, st control.StatusResult, p string) control.StatusEntry {
	t.Helper()
	for _, e := range st.Entries {
		if e.Path == p {
			return e
		}
	}
	t.Fatalf("status has no entry for %s: %+v", p, st.Entries)
	return control.StatusEntry{}
}

// checkEntry checks the kind, pid and command status shows for p.
func checkEntry(t *testing.T, st control.StatusResult, what, p, kind string, pid int, comm string) {
	t.Helper()
	e := statusEntry(t, st, p)
	if e.Kind != kind || e.PID != pid || e.Comm != comm {
		t.Errorf("%s: status of %s = kind %q pid %d comm %q; want kind %q pid %d comm %q", what, p, e.Kind, e.PID, e.Comm, kind, pid, comm)
	}
}

// The waits are longer than the daemon's /proc cache (2 s), so a status
// that looked the command up by pid at status time would find nothing.
const pastProcCache = 2600 * time.Millisecond

// TestStatusLastChanger: status names the process that changed a path
// last, with the command name it had then, tells a metadata change from a
// write, and keeps both across a restart; the journal says what a setattr
// changed.
func TestStatusLastChanger(t *testing.T) {
	m := mountStagefs(t, withFiles(map[string]string{
		"f.txt":  "one\n",
		"run.sh": "#!/bin/sh\necho hi\n",
		"h.txt":  "h\n",
	}))

	// One command stages f.txt; later, another one changes it again.
	shPid := runPid(t, m.mnt, "", "sh", "-c", "echo two > f.txt")
	time.Sleep(pastProcCache)
	checkEntry(t, m.status(), "after sh", "f.txt", "write", shPid, "sh")
	teePid := runPid(t, m.mnt, "three\n", "tee", "-a", "f.txt")
	time.Sleep(pastProcCache)
	checkEntry(t, m.status(), "after tee -a", "f.txt", "write", teePid, "tee")
	assertFile(t, m.in("f.txt"), "two\nthree\n")

	// chmod and touch (-c: utimensat, no open) change attributes only.
	chmodPid := runPid(t, m.mnt, "", "chmod", "0700", "run.sh")
	touchPid := runPid(t, m.mnt, "", "touch", "-c", "-d", "@1000000000", "h.txt")
	st := m.status()
	checkEntry(t, st, "after chmod", "run.sh", "meta", chmodPid, "chmod")
	checkEntry(t, st, "after touch", "h.txt", "meta", touchPid, "touch")

	// The journal says what each setattr changed, and who did it.
	wantDetail := map[string]string{
		"run.sh": "mode=0700",
		"h.txt":  "atime=2001-09-09T01:46:40Z mtime=2001-09-09T01:46:40Z",
	}
	wantComm := map[string]string{"run.sh": "chmod", "h.txt": "touch"}
	var lr control.LogResult
	if err := json.Unmarshal([]byte(m.mustCLI("log", "--json", "run.sh", "h.txt")), &lr); err != nil {
		t.Fatal(err)
	}
	for _, rec := range lr.Records {
		if rec.Op != "setattr" {
			continue
		}
		if rec.Detail != wantDetail[rec.Path] || rec.Comm != wantComm[rec.Path] {
			t.Errorf("log: setattr of %s: detail %q comm %q; want %q %q", rec.Path, rec.Detail, rec.Comm, wantDetail[rec.Path], wantComm[rec.Path])
		}
		delete(wantDetail, rec.Path)
	}
	if len(wantDetail) > 0 {
		t.Errorf("log has no setattr record of %v: %+v", wantDetail, lr.Records)
	}

	// A write to the chmod'ed file makes it a write.
	ddPid := runPid(t, m.mnt, "", "dd", "if=/dev/zero", "of=run.sh", "bs=1", "count=1", "seek=1", "conv=notrunc", "status=none")
	checkEntry(t, m.status(), "after dd", "run.sh", "write", ddPid, "dd")

	// A restart keeps it all.
	m.unmount()
	m.mount()
	st = m.status()
	checkEntry(t, st, "after restart", "f.txt", "write", teePid, "tee")
	checkEntry(t, st, "after restart", "run.sh", "write", ddPid, "dd")
	checkEntry(t, st, "after restart", "h.txt", "meta", touchPid, "touch")
}

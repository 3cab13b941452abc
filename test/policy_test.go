package test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --deny and --hide hold for every process in the mount, also inside
// stagefs run, and are listed by initialize and status.
func TestPolicyDenyHide(t *testing.T) {
	requireFUSE(t)
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{
		".git/config":           "cfg\n",
		".git/hooks/pre-commit": "hook\n",
		".env":                  "SECRET=1\n",
		"a.txt":                 "a\n",
	}), withMountFlags("--deny", ".git/hooks/**", "--deny", ".git/config", "--hide", ".env"))
	before := snapshot(t, m.ws)

	if _, err := os.Stat(m.in(".env")); !os.IsNotExist(err) {
		t.Errorf("hidden .env: stat gave %v, want not exist", err)
	}
	if b, err := os.ReadFile(m.in(".git/config")); err != nil || string(b) != "cfg\n" {
		t.Errorf("denied .git/config must stay readable: %q, %v", b, err)
	}
	for _, cmd := range [][]string{
		{"sh", "-c", "echo x >> .git/config"},
		{"sh", "-c", "echo x > .git/hooks/post-checkout"},
		{"rm", ".git/hooks/pre-commit"},
		{"mv", ".git", "git-moved"},
		{"cat", ".env"},
	} {
		if r := runIn(t, cmdSpec{dir: m.mnt}, cmd[0], cmd[1:]...); r.code == 0 {
			t.Errorf("%s succeeded in the mount", strings.Join(cmd, " "))
		}
	}
	// The same refusals inside stagefs run, at the workspace's own path.
	if r := m.run(m.ws, "--", "sh", "-c", "echo x >> .git/config"); r.code == 0 {
		t.Errorf("a denied write succeeded inside stagefs run")
	}
	if r := m.run(m.ws, "--", "cat", ".env"); r.code == 0 {
		t.Errorf("a hidden file was readable inside stagefs run: %s", r.stdout)
	}
	if r := runIn(t, cmdSpec{dir: m.mnt}, "sh", "-c", "echo more >> a.txt"); r.code != 0 {
		t.Errorf("an allowed write failed: %s", r)
	}
	assertSameTree(t, "workspace", before, snapshot(t, m.ws))

	st := m.status()
	if len(st.Policy.Deny) != 2 || len(st.Policy.Hide) != 1 {
		t.Errorf("status policy = %+v", st.Policy)
	}
	c := m.dial()
	defer c.Close()
	init, err := c.Initialize(context.Background())
	if err != nil || len(init.Policy.Deny) != 2 || init.Policy.Hide[0] != ".env" {
		t.Errorf("initialize policy = %+v, %v", init.Policy, err)
	}
	log := m.mustCLI("log")
	if strings.Count(log, "denied") < 3 {
		t.Errorf("refused attempts are not journaled:\n%s", log)
	}
}

// A malformed glob would match nothing, leaving open what the user meant
// to protect; negative limits mean nothing. The mount refuses both, as a
// usage error, and mounts nothing.
func TestMountRefusesABadGlobOrANegativeLimit(t *testing.T) {
	parallel(t)
	base := t.TempDir()
	ws, mnt := filepath.Join(base, "ws"), filepath.Join(base, "mnt")
	for _, d := range []string{ws, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--deny", "secrets/["}, `--deny: "secrets/[" is not a glob`},
		{[]string{"--hide", "/"}, "--hide: an empty glob matches nothing"},
		{[]string{"--no-capture", "a[b"}, "--no-capture"},
		{[]string{"--max-turns", "-1"}, "cannot be negative"},
		{[]string{"--cache-timeout", "-1s"}, "cannot be negative"},
	} {
		r := runStagefs(t, append([]string{"mount", ws, mnt, "--state", filepath.Join(base, "st")}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("mount %v: want exit 2 and %q: %s", c.args, c.want, r)
		}
		if isMounted(mnt) {
			runStagefs(t, "unmount", mnt)
			t.Fatalf("mount %v mounted", c.args)
		}
	}
}

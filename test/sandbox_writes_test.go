package test

// What stagefs run, stagefs claude and stagefs acp let a command write
// outside the workspace (issue #22): by default nothing for real. Writes
// under $HOME land in the mount's scratch layer, /tmp and /var/tmp are
// the mount's own, --allow PATH writes for real and --outside rw brings
// back the caller's own rights.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"stagefs/control"
	"stagefs/test/agentsim"
)

// withTestBinaries lets the commands of stagefs run reach the tests' build
// directory (test/rawrpc is built there), which is in the host's /tmp:
// the sandbox gives a mount a /tmp of its own unless a path is allowed.
func withTestBinaries() mountOption {
	return withMountFlags("--allow", filepath.Dir(stagefsBin))
}

// scratchJSON is `stagefs scratch --json`.
type scratchJSON struct {
	Dir   string `json:"dir"`
	Bytes int64  `json:"bytes"`
	InUse bool   `json:"inUse"`
	Areas []struct {
		Path    string `json:"path"`
		Home    bool   `json:"home"`
		Bytes   int64  `json:"bytes"`
		Entries []struct {
			Path  string `json:"path"`
			Kind  string `json:"kind"`
			Bytes int64  `json:"bytes"`
		} `json:"entries"`
	} `json:"areas"`
}

// entries maps each path the scratch layer lists to its kind.
func (s scratchJSON) entries() map[string]string {
	out := map[string]string{}
	for _, a := range s.Areas {
		for _, e := range a.Entries {
			out[e.Path] = e.Kind
		}
	}
	return out
}

func parseScratch(t *testing.T, r result) scratchJSON {
	t.Helper()
	var s scratchJSON
	if r.code != 0 {
		t.Fatalf("stagefs scratch --json: %s", r)
	}
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("stagefs scratch --json: %v\n%s", err, r.stdout)
	}
	return s
}

// outsideDir makes a directory outside /tmp and $HOME (which the sandbox
// replaces) holding outside.txt, owned by uid when it is not 0, and
// removes it after the test.
func outsideDir(t *testing.T, uid int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a directory outside /tmp and $HOME")
	}
	home, _ := os.UserHomeDir()
	for _, parent := range []string{"/var/cache", "/var/lib", "/opt", "/srv"} {
		if st, err := os.Stat(parent); err != nil || !st.IsDir() || (home != "" && strings.HasPrefix(parent+"/", home+"/")) {
			continue
		}
		dir, err := os.MkdirTemp(parent, "stagefs-test-outside-")
		if err != nil {
			continue
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		writeTree(t, dir, map[string]string{"outside.txt": "outside\n", "other.txt": "other\n"})
		if uid != 0 {
			for _, p := range []string{dir, filepath.Join(dir, "outside.txt"), filepath.Join(dir, "other.txt")} {
				if err := os.Chown(p, uid, uid); err != nil {
					t.Fatal(err)
				}
			}
			os.Chmod(dir, 0o755)
		}
		return dir
	}
	t.Skip("no directory outside /tmp and $HOME to make one in")
	return ""
}

// writeAttempts tries every kind of write on the outside file $1 and its
// directory $2, and appends through $3, a symlink in the workspace, and
// through a relative symlink the command makes itself ($4 its target).
// Each attempt prints "NAME: " and its error, or "NAME: WROTE".
const writeAttempts = `F=$1 D=$2 L=$3 REL=$4
try() { name=$1; shift; if out=$("$@" 2>&1); then echo "$name: WROTE"; else echo "$name: $out"; fi; }
try append sh -c 'echo x >> "$0"' "$F"
try append-through-link sh -c 'echo x >> "$0"' "$L"
ln -s "$REL" esc
try append-through-relative-link sh -c 'echo x >> esc'
try create sh -c 'echo x > "$0/new.txt"' "$D"
try unlink rm -f "$F"
try rename mv "$F" "$D/renamed.txt"
try chmod chmod 0600 "$F"
try truncate truncate -s 0 "$F"
try mkdir mkdir "$D/sub"
try symlink ln -s x "$D/link"
`

// checkReadOnlyOutside runs writeAttempts through runInside and checks
// that each one failed with EROFS and that nothing outside changed.
func checkReadOnlyOutside(t *testing.T, runInside func(dir string, args ...string) result, ws, dir string) {
	t.Helper()
	file := filepath.Join(dir, "outside.txt")
	before := snapshot(t, dir)
	hash := sha256Hex([]byte(readFile(t, file)))
	rel, err := filepath.Rel(ws, file)
	if err != nil {
		t.Fatal(err)
	}
	r := runInside(ws, "--", "sh", "-c", writeAttempts, "sh", file, dir, filepath.Join(ws, "link"), rel)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 10 {
		t.Fatalf("the write attempts did not all run: %s", r)
	}
	for _, l := range lines {
		if !strings.HasSuffix(l, "Read-only file system") {
			t.Errorf("outside the workspace, want EROFS, got %q", l)
		}
	}
	if got := sha256Hex([]byte(readFile(t, file))); got != hash {
		t.Errorf("%s changed: sha256 %s, was %s", file, got, hash)
	}
	assertSameTree(t, "the directory outside the workspace", before, snapshot(t, dir))
}

// Outside the workspace every write fails with EROFS, also through a
// symlink in the workspace, as root and as an ordinary user; the same
// user may write there outside the sandbox, so the refusal is the
// sandbox's.
func TestSandboxOutsideIsReadOnly(t *testing.T) {
	t.Run("root", func(t *testing.T) {
		parallel(t)
		dir := outsideDir(t, 0)
		m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}), withSymlink("link", filepath.Join(dir, "outside.txt")))
		checkReadOnlyOutside(t, m.run, m.ws, dir)
		// The workspace itself is writable, staged, and the symlink the
		// command made is staged too.
		m.mustRunIn(m.ws, "--", "sh", "-c", "echo more >> f.txt")
		if kinds := statusKinds(m.status()); kinds["f.txt"] != "write" || kinds["esc"] != "symlink" {
			t.Errorf("pending after the attempts: %v", kinds)
		}
	})
	t.Run("unprivileged", func(t *testing.T) {
		parallel(t)
		u := startUserMount(t, map[string]string{"f.txt": "f\n"})
		uid, _ := strconv.Atoi(u.uid)
		dir := outsideDir(t, uid)
		link := filepath.Join(u.ws, "link")
		if err := os.Symlink(filepath.Join(dir, "outside.txt"), link); err != nil {
			t.Fatal(err)
		}
		os.Lchown(link, uid, uid)
		checkReadOnlyOutside(t, u.run, u.ws, dir)
		if r := u.as("", "sh", "-c", `echo x >> "$0"`, filepath.Join(dir, "other.txt")); r.code != 0 {
			t.Errorf("uid %s cannot write %s outside the sandbox either; the test proves nothing: %s", u.uid, dir, r)
		}
	})
}

// toolEnv is the environment of a command that runs Go and npm with their
// defaults under home: every cache and setting under $HOME.
func toolEnv(home string) []string {
	return []string{
		"HOME=" + home,
		"PATH=" + filepath.Dir(goBin) + ":/usr/local/bin:/usr/bin:/bin",
		"GOCACHE=", "GOPATH=", "GOMODCACHE=", "GOENV=", "GOFLAGS=", "GOTOOLCHAIN=local", "GOPROXY=off",
		"XDG_CACHE_HOME=", "XDG_CONFIG_HOME=", "XDG_DATA_HOME=", "XDG_STATE_HOME=",
	}
}

// toolWork builds a Go module and installs an npm package from the
// registry, both in the workspace, with their caches under $HOME.
const toolWork = `set -e
go build -o hello .
./hello
npm install --no-audit --no-fund --no-update-notifier ms@2.1.3 >/dev/null
node -e 'console.log(require("ms")(60000))'
echo 'history' >> ~/.bash_history
echo 'export EVIL=1' >> ~/.bashrc
`

var toolFiles = map[string]string{
	"go.mod":  "module hello\n\ngo 1.22\n",
	"main.go": "package main\n\nfunc main() { println(\"built\") }\n",
}

// checkToolsInScratch runs toolWork inside with home as $HOME, then checks
// that the real home is unchanged, that the scratch layer lists the
// caches, and that dropping it empties it. inside runs `stagefs run`
// with extra environment; cli runs another stagefs command on the mount.
func checkToolsInScratch(t *testing.T, home string, inside func(env []string, args ...string) result, cli func(args ...string) result) {
	t.Helper()
	before := snapshot(t, home)
	r := inside(toolEnv(home), "--", "sh", "-c", toolWork)
	if r.code != 0 || !strings.Contains(r.stderr, "built") || !strings.HasSuffix(r.stdout, "1m\n") {
		t.Fatalf("go build and npm install inside, with the defaults: %s", r)
	}
	assertSameTree(t, "the real $HOME after go build and npm install", before, snapshot(t, home))
	if out := inside(toolEnv(home), "--", "sh", "-c", "cat ~/.bashrc; ls ~/.cache"); !strings.Contains(out.stdout, "export EVIL=1") || !strings.Contains(out.stdout, "go-build") {
		t.Errorf("a later run does not see the scratch layer: %s", out)
	}

	sc := parseScratch(t, cli("scratch", "--json"))
	kinds := sc.entries()
	for p, want := range map[string]string{".cache": "new", ".npm": "new", ".bash_history": "new", ".bashrc": "changed"} {
		if got := kinds[filepath.Join(home, p)]; got != want {
			t.Errorf("the scratch layer lists %s as %q, want %q; it lists %v", p, got, want, kinds)
		}
	}
	if sc.Bytes < 1<<20 || sc.InUse {
		t.Errorf("the scratch layer: %d bytes, in use %v; want the caches (over 1 MiB) and no run", sc.Bytes, sc.InUse)
	}
	text := cli("scratch")
	if text.code != 0 || !strings.Contains(text.stdout, "$HOME "+home) || !strings.Contains(text.stdout, filepath.Join(home, ".npm")) {
		t.Errorf("stagefs scratch: %s", text)
	}
	var st control.StatusResult
	if r := cli("status", "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Sandbox == nil ||
		st.Sandbox.Outside != "ro" || st.Sandbox.Scratch == nil || st.Sandbox.Scratch.Bytes != sc.Bytes {
		t.Errorf("status --json does not report the scratch layer (%+v): %s", st.Sandbox, r)
	}

	if r := cli("scratch", "--drop"); r.code != 0 || !strings.Contains(r.stdout, "dropped the scratch layer") {
		t.Fatalf("stagefs scratch --drop: %s", r)
	}
	if sc := parseScratch(t, cli("scratch", "--json")); len(sc.Areas) != 0 || sc.Bytes != 0 {
		t.Errorf("the scratch layer after --drop: %+v", sc)
	}
	if out := inside(toolEnv(home), "--", "sh", "-c", "ls -A ~"); out.code != 0 || out.stdout != ".bashrc\n" {
		t.Errorf("$HOME inside after the drop, want the real one (.bashrc only): %s", out)
	}
	assertSameTree(t, "the real $HOME after the drop", before, snapshot(t, home))
}

// Go and npm work inside with their defaults, as root and as an ordinary
// user: their caches, the shell history and a changed ~/.bashrc land in
// the scratch layer, never in the real $HOME, and the layer lists and
// drops them.
func TestSandboxToolsWriteScratchHome(t *testing.T) {
	requireTool(t, "npm")
	requireTool(t, "node")
	t.Run("root", func(t *testing.T) {
		parallel(t)
		m := mountStagefs(t, withFiles(toolFiles))
		home := filepath.Join(m.base, "home")
		writeTree(t, home, map[string]string{".bashrc": "# the real one\n"})
		inside := func(env []string, args ...string) result {
			return runIn(t, cmdSpec{dir: m.ws, env: append(env, "PWD="+m.ws)}, stagefsBin, append([]string{"run", "-m", m.mnt}, args...)...)
		}
		checkToolsInScratch(t, home, inside, m.cli)
		// What the tools made in the workspace is staged, as ever.
		if kinds := statusKinds(m.status()); kinds["hello"] != "create" || kinds["node_modules/ms/package.json"] != "create" {
			t.Errorf("pending after the build: %v", kinds)
		}
	})
	t.Run("unprivileged", func(t *testing.T) {
		parallel(t)
		u := startUserMount(t, toolFiles)
		uid, _ := strconv.Atoi(u.uid)
		gid, _ := strconv.Atoi(u.gid)
		home := filepath.Join(u.base, "home")
		writeTree(t, home, map[string]string{".bashrc": "# the real one\n"})
		for _, p := range []string{home, filepath.Join(home, ".bashrc")} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		inside := func(env []string, args ...string) result {
			return u.as(u.ws, "env", append(env, append([]string{u.bin, "run", "-m", u.mnt}, args...)...)...)
		}
		cli := func(args ...string) result { return u.as("", u.bin, append(args, "-m", u.mnt)...) }
		checkToolsInScratch(t, home, inside, cli)
	})
}

// --allow DIR writes DIR for real, under /tmp too; what is next to it
// stays read-only. The mount reports its settings in session/initialize,
// status and mount --json.
func TestSandboxAllow(t *testing.T) {
	parallel(t)
	dir := outsideDir(t, 0)
	allowed := filepath.Join(dir, "allowed")
	os.Mkdir(allowed, 0o755)
	inTmp := shortTempDir(t)
	m := mountStagefs(t, withMountFlags("--allow", allowed, "--allow", inTmp))
	r := m.run(m.ws, "--", "sh", "-c", `echo real > "$1/f.txt" && echo tmp > "$2/g.txt" && echo no > "$3/h.txt"`, "sh", allowed, inTmp, dir)
	if r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
		t.Errorf("writing next to the allowed directory: %s, want EROFS", r)
	}
	assertFile(t, filepath.Join(allowed, "f.txt"), "real\n")
	assertFile(t, filepath.Join(inTmp, "g.txt"), "tmp\n")
	assertMissing(t, filepath.Join(dir, "h.txt"))

	init, err := m.dial().Initialize(t.Context())
	if err != nil || init.Sandbox.Outside != "ro" || strings.Join(init.Sandbox.Allow, " ") != allowed+" "+inTmp {
		t.Errorf("session/initialize reports the sandbox as %+v (%v), want ro and --allow %s %s", init.Sandbox, err, allowed, inTmp)
	}
	if st := m.status(); st.Sandbox == nil || len(st.Sandbox.Allow) != 2 {
		t.Errorf("status reports the sandbox as %+v", st.Sandbox)
	}
}

// /tmp and /var/tmp inside are the mount's: the host's files are not
// there, what a run leaves there the next run finds and the host does
// not, and another mount has its own. /dev/shm is the run's own; /dev
// works.
func TestSandboxPrivateTmp(t *testing.T) {
	parallel(t)
	hostDir, err := os.MkdirTemp("/tmp", "stagefs-hosttmp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	writeTree(t, hostDir, map[string]string{"host.txt": "host\n"})
	name := fmt.Sprintf("/tmp/stagefs-private-%d", time.Now().UnixNano())
	shm := "/dev/shm/" + filepath.Base(name)
	t.Cleanup(func() { os.Remove(name); os.Remove(shm) })

	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	script := `test -e "$1/host.txt" && echo HOST-TMP-VISIBLE
echo inside > "$2"
echo shm > "$3"
echo discard > /dev/null
[ -d /var/tmp ] && ! [ -L /var/tmp ] && echo var > /var/tmp/` + filepath.Base(name) + `
echo done`
	r := m.run(m.ws, "--", "sh", "-c", script, "sh", hostDir, name, shm)
	if r.code != 0 || r.stdout != "done\n" {
		t.Fatalf("writing /tmp, /var/tmp and /dev/shm inside: %s", r)
	}
	assertMissing(t, name)
	assertMissing(t, shm)
	assertMissing(t, "/var/tmp/"+filepath.Base(name))
	if r := m.run(m.ws, "--", "sh", "-c", `cat "$1"; test -e "$2" || echo no-shm`, "sh", name, shm); r.code != 0 || r.stdout != "inside\nno-shm\n" {
		t.Errorf("a second run of the mount, want its /tmp and a /dev/shm of its own: %s", r)
	}
	if kinds := parseScratch(t, m.cli("scratch", "--json")).entries(); kinds[name] != "new" {
		t.Errorf("stagefs scratch does not list %s: %v", name, kinds)
	}
	other := mountStagefs(t, withFiles(map[string]string{"g.txt": "g\n"}))
	if r := other.run(other.ws, "--", "sh", "-c", `test -e "$1" && echo SEEN; true`, "sh", name); r.code != 0 || r.stdout != "" {
		t.Errorf("another mount sees the first one's /tmp: %s", r)
	}
}

// --outside rw is the behaviour before the confinement: the command
// writes outside the workspace and $HOME for real, /tmp is the host's and
// nothing goes to the scratch layer. The flags are checked at mount.
func TestSandboxOutsideWritable(t *testing.T) {
	parallel(t)
	dir := outsideDir(t, 0)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}), withMountFlags("--outside", "rw"))
	home := filepath.Join(m.base, "home")
	writeTree(t, home, map[string]string{".bashrc": "# real\n"})
	r := runIn(t, cmdSpec{dir: m.ws, env: []string{"HOME=" + home, "PWD=" + m.ws}}, stagefsBin, "run", "-m", m.mnt, "--",
		"sh", "-c", `echo x >> "$1/outside.txt" && echo y >> ~/.bashrc && echo z > "$2/host-tmp.txt"`, "sh", dir, m.base)
	if r.code != 0 {
		t.Fatalf("writing outside with --outside rw: %s", r)
	}
	assertFile(t, filepath.Join(dir, "outside.txt"), "outside\nx\n")
	assertFile(t, filepath.Join(home, ".bashrc"), "# real\ny\n")
	assertFile(t, filepath.Join(m.base, "host-tmp.txt"), "z\n")
	if sc := parseScratch(t, m.cli("scratch", "--json")); len(sc.Areas) != 0 {
		t.Errorf("the scratch layer with --outside rw: %+v", sc)
	}
	if init, err := m.dial().Initialize(t.Context()); err != nil || init.Sandbox.Outside != "rw" {
		t.Errorf("session/initialize with --outside rw: %+v %v", init.Sandbox, err)
	}

	base := shortTempDir(t)
	ws, mnt := filepath.Join(base, "ws"), filepath.Join(base, "mnt")
	os.MkdirAll(filepath.Join(ws, "sub"), 0o755)
	for _, tc := range []struct {
		flags []string
		code  int
		want  string
	}{
		{[]string{"--outside", "maybe"}, 2, "--outside must be ro or rw"},
		{[]string{"--allow", "/"}, 2, "--outside rw"},
		{[]string{"--allow", filepath.Join(ws, "sub")}, 2, "in the workspace"},
		{[]string{"--allow", dir, "--outside", "rw"}, 2, "no use with --outside rw"},
		{[]string{"--allow", filepath.Join(base, "missing")}, 1, "no such file"},
	} {
		r := runStagefs(t, append([]string{"mount", ws, mnt, "--state", filepath.Join(base, "st")}, tc.flags...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || isMounted(mnt) {
			t.Errorf("stagefs mount %v: want exit %d and %q, got %s", tc.flags, tc.code, tc.want, r)
			if isMounted(mnt) {
				forceUnmount(mnt)
			}
		}
	}
}

// Only one run at a time mounts the scratch layer over $HOME: one that
// starts meanwhile is told so and writes a layer of its own, which ends
// with it. The layer cannot be dropped while a run uses it.
func TestSandboxScratchWhileInUse(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	home := filepath.Join(m.base, "home")
	writeTree(t, home, map[string]string{".bashrc": "# real\n"})
	env := []string{"HOME=" + home, "PWD=" + m.ws}
	first := exec.Command(stagefsBin, "run", "-m", m.mnt, "--", "sh", "-c",
		`echo a > ~/a.txt; touch started; i=0; while [ ! -e release ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done`)
	first.Dir, first.Env = m.ws, append(baseEnv(), env...)
	var firstErr strings.Builder
	first.Stderr = &firstErr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- first.Wait() }()
	if !waitFor(20*time.Second, func() bool { _, err := os.Stat(m.in("started")); return err == nil }) {
		t.Fatalf("the first run never started: %s", firstErr.String())
	}
	if st := m.status(); st.Sandbox == nil || st.Sandbox.Scratch == nil || !st.Sandbox.Scratch.InUse {
		t.Errorf("status while a run uses the scratch layer: %+v", st.Sandbox)
	}
	if r := m.cli("scratch", "--drop"); r.code != 3 || !strings.Contains(r.stderr, "using the scratch layer") {
		t.Errorf("stagefs scratch --drop while a run uses it: %s, want exit 3", r)
	}
	second := runIn(t, cmdSpec{dir: m.ws, env: env}, stagefsBin, "run", "-m", m.mnt, "--", "sh", "-c", "echo b > ~/b.txt; cat ~/b.txt; touch release")
	if second.code != 0 || second.stdout != "b\n" || !strings.Contains(second.stderr, "another run of this mount holds the scratch layer") {
		t.Errorf("a run while another holds the scratch layer: %s", second)
	}
	if err := <-done; err != nil {
		t.Fatalf("the first run: %v: %s", err, firstErr.String())
	}
	if r := runIn(t, cmdSpec{dir: m.ws, env: env}, stagefsBin, "run", "-m", m.mnt, "--", "sh", "-c", "ls ~"); r.code != 0 || r.stdout != "a.txt\n" {
		t.Errorf("$HOME after both runs: want the first run's a.txt only, got %s", r)
	}
	assertMissing(t, filepath.Join(home, "a.txt"))
	assertMissing(t, filepath.Join(home, "b.txt"))
	if r := m.cli("scratch", "--drop"); r.code != 0 {
		t.Errorf("stagefs scratch --drop after the runs: %s", r)
	}
}

// When overlayfs will not put the scratch layer over $HOME, the run says
// so and $HOME stays read-only: nothing runs with $HOME writable for real
// without a word. Provoked by a scratch layer whose work dir is a file.
func TestSandboxHomeWithoutScratchLayer(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	home := filepath.Join(m.base, "home")
	writeTree(t, home, map[string]string{".bashrc": "# real\n"})
	env := []string{"HOME=" + home, "PWD=" + m.ws}
	if r := runIn(t, cmdSpec{dir: m.ws, env: env}, stagefsBin, "run", "-m", m.mnt, "--", "true"); r.code != 0 {
		t.Fatalf("a first run: %s", r)
	}
	layers, _ := filepath.Glob(filepath.Join(m.state, "scratch", "home-*"))
	if len(layers) != 1 {
		t.Fatalf("the scratch layers in the state dir: %v", layers)
	}
	work := filepath.Join(layers[0], "work")
	if err := removeTreeForTest(work); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(work, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := runIn(t, cmdSpec{dir: m.ws, env: env}, stagefsBin, "run", "-m", m.mnt, "--", "sh", "-c", "echo x >> ~/.bashrc")
	if r.code == 0 || !strings.Contains(r.stderr, "read-only in this sandbox") || !strings.Contains(r.stderr, "Read-only file system") {
		t.Errorf("a run whose scratch layer cannot be mounted: %s, want the warning and EROFS", r)
	}
	assertFile(t, filepath.Join(home, ".bashrc"), "# real\n")
}

// removeTreeForTest removes a tree an overlay mount used (its work dir
// has mode 000).
func removeTreeForTest(p string) error {
	filepath.WalkDir(p, func(q string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

// A Bash tool call under stagefs claude that writes ~/.bashrc changes
// nothing real: Claude Code's own files and the tool call's write all go
// to the scratch layer, where stagefs scratch shows them.
func TestSandboxClaudeWritesBashrc(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"f.txt": "f\n"}))
	s := newClaudeSession(t, m, agentsim.Scripts{
		"bashrc prompt": {
			agentsim.Call("Bash", map[string]any{"command": "echo 'alias ls=rm' >> ~/.bashrc && tail -n 1 ~/.bashrc", "description": "dotfile"}),
			agentsim.Text("bashrc done"),
		},
	})
	writeTree(t, s.home, map[string]string{".bashrc": "# the real one\n"})
	before := snapshot(t, s.home)
	// Claude Code asks before a command writes outside its working
	// directory; the test's stand-in user says yes to everything.
	r := s.prompt("bashrc prompt", "--dangerously-skip-permissions")
	if r.code != 0 || !strings.Contains(r.stdout, "bashrc done") {
		t.Fatalf("stagefs claude: %s", r)
	}
	if res := s.srv.ToolResults(); len(res) != 1 || !strings.HasPrefix(res[0].Output, "alias ls=rm") {
		t.Errorf("the tool call's output, want the line it appended: %+v", res)
	}
	assertFile(t, filepath.Join(s.home, ".bashrc"), "# the real one\n")
	assertSameTree(t, "the real $HOME after a Claude Code session", before, snapshot(t, s.home))
	if kinds := parseScratch(t, m.cli("scratch", "--json")).entries(); kinds[filepath.Join(s.home, ".bashrc")] != "changed" {
		t.Errorf("stagefs scratch does not list ~/.bashrc as changed: %v", kinds)
	}
}

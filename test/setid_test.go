package test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// nobody is the uid (and gid) the tests below write as: a process without
// CAP_FSETID.
const nobody = 65534

// TestSetIDBitsGoLikeOnALocalDisk runs the same writes, truncations and
// truncating opens on a plain directory and in the mount, as a process
// without CAP_FSETID and as root, and requires the same set-user-id and
// set-group-id bits afterwards, in the view and, once committed, in the
// workspace: the daemon does its own writes as root, for whom the disk
// clears nothing, so the bits go only because the kernel asks the daemon
// to clear them. With passthrough and without: writes reach the daemon
// only without it. (The kernel's FUSE code keeps a set-group-id bit
// without group execute where a local disk drops it for a writer outside
// the file's group; that case is not here.)
func TestSetIDBitsGoLikeOnALocalDisk(t *testing.T) {
	parallel(t)
	cases := []struct {
		name   string
		mode   uint32 // the file's permission and set-id bits before
		uid    int    // who runs the script (0: root)
		script string // run in the file's directory on the file f
	}{
		{"append", 0o6777, nobody, `echo more >> f`},
		{"truncate", 0o6777, nobody, `truncate -s 2 f`},
		{"truncating open", 0o6777, nobody, `echo new > f`},
		{"append by root", 0o6755, 0, `echo more >> f`},
		{"truncate by root", 0o6755, 0, `truncate -s 2 f`},
	}
	for _, flags := range [][]string{nil, {"--no-passthrough"}} {
		t.Run(fmt.Sprintf("mount%v", flags), func(t *testing.T) {
			files := map[string]string{}
			for i := range cases {
				files[fmt.Sprintf("c%d/f", i)] = "content\n"
			}
			m := mountStagefs(t, withFiles(files), withMountFlags(flags...))
			native := filepath.Join(m.base, "native")
			openToAll(t, m.base)
			for i, c := range cases {
				dir := fmt.Sprintf("c%d", i)
				require.NoError(t, os.MkdirAll(filepath.Join(native, dir), 0o777))
				require.NoError(t, os.Chmod(filepath.Join(native, dir), 0o777))
				require.NoError(t, os.Chmod(m.inWS(dir), 0o777))
				for _, f := range []string{filepath.Join(native, dir, "f"), m.inWS(dir + "/f")} {
					require.NoError(t, os.WriteFile(f, []byte("content\n"), 0o644))
					require.NoError(t, unix.Chmod(f, c.mode)) // (os.Chmod reads set-id bits from os.FileMode's own)
				}
			}
			for i, c := range cases {
				dir := fmt.Sprintf("c%d", i)
				for _, where := range []string{filepath.Join(native, dir), m.in(dir)} {
					r := runIn(t, cmdSpec{dir: where, uid: c.uid}, "sh", "-c", c.script)
					require.Zero(t, r.code, "%s in %s: %s", c.name, where, r)
				}
				want := modeOf(t, filepath.Join(native, dir, "f"))
				got := modeOf(t, m.in(dir+"/f"))
				require.Equal(t, fmt.Sprintf("%04o", want), fmt.Sprintf("%04o", got), "%s: the mount's mode after it, against a local disk's", c.name)
				require.Equal(t, readFile(t, filepath.Join(native, dir, "f")), readFile(t, m.in(dir+"/f")), c.name)
				// The workspace keeps its bits until a commit.
				require.Equal(t, fmt.Sprintf("%04o", c.mode), fmt.Sprintf("%04o", modeOf(t, m.inWS(dir+"/f"))), c.name)
			}
			// What the mount showed is what a commit writes.
			m.commit()
			for i, c := range cases {
				dir := fmt.Sprintf("c%d", i)
				require.Equal(t, fmt.Sprintf("%04o", modeOf(t, filepath.Join(native, dir, "f"))), fmt.Sprintf("%04o", modeOf(t, m.inWS(dir+"/f"))), "%s: after the commit", c.name)
			}
		})
	}
}

// TestWriteRemovesFileCapability: a write removes a file capability
// (security.capability), in the mount as on a local disk, so that a file
// changed by a write does not keep privileges granted to the old bytes.
func TestWriteRemovesFileCapability(t *testing.T) {
	parallel(t)
	m := mountStagefs(t, withFiles(map[string]string{"capped": "y\n"}))
	// cap_net_raw, permitted: a version 2 vfs_cap_data.
	capV2 := make([]byte, 20)
	binary.LittleEndian.PutUint32(capV2[0:], 0x02000000)
	binary.LittleEndian.PutUint32(capV2[4:], 1<<13)
	native := filepath.Join(m.base, "native-capped")
	require.NoError(t, os.WriteFile(native, []byte("y\n"), 0o755))
	for _, f := range []string{native, m.in("capped")} {
		require.NoError(t, unix.Setxattr(f, "security.capability", capV2, 0), f)
		_, err := unix.Getxattr(f, "security.capability", make([]byte, 64))
		require.NoError(t, err, f)
		mustRun(t, cmdSpec{}, "sh", "-c", `echo more >> "$1"`, "sh", f)
		_, err = unix.Getxattr(f, "security.capability", make([]byte, 64))
		require.True(t, errors.Is(err, unix.ENODATA), "%s: security.capability after a write: %v", f, err)
	}
	// The capability set through the mount was staged: the workspace's
	// file never had it.
	_, err := unix.Getxattr(m.inWS("capped"), "security.capability", make([]byte, 64))
	require.True(t, errors.Is(err, unix.ENODATA), "the workspace's file: %v", err)
}

// openToAll lets every user through dir and the test's own directories
// above it.
func openToAll(t testing.TB, dir string) {
	t.Helper()
	top := filepath.Clean(os.TempDir())
	for d := dir; strings.HasPrefix(d, top+"/"); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
}

func modeOf(t testing.TB, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(path, &st), path)
	return st.Mode & 0o7777
}

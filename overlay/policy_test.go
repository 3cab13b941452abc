package overlay_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"stagefs/overlay"
)

func TestPolicyDenyAndHide(t *testing.T) {
	h := newHarness(t)
	require.NoError(t, h.e.Close())
	h.e = nil
	h.opts.Deny = []string{".git/hooks/**", ".git/config"}
	h.opts.Hide = []string{".env", "*.pem"}
	h.open()
	h.baseFile(".git/config", "cfg\n")
	h.baseFile(".git/hooks/pre-commit", "hook\n")
	h.baseFile(".env", "SECRET\n")
	h.baseFile("keys/id.pem", "KEY\n")
	h.baseFile("a.txt", "a\n")
	ws := h.wsSnapshot()

	// Denied: readable, but no change of any kind.
	require.Equal(t, "cfg\n", h.read(".git/config"))
	_, err := h.e.Open(".git/config", unix.O_WRONLY, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	_, _, err = h.e.Create(".git/hooks/post-checkout", unix.O_WRONLY, 0o755, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	require.ErrorIs(t, h.e.Unlink(".git/hooks/pre-commit", caller), syscall.EACCES)
	require.ErrorIs(t, h.e.Rename(".git", "git2", 0, caller), syscall.EACCES, "moving a denied path's parent")
	_, err = h.e.Setattr(".git/config", -1, overlay.SetAttr{Mode: u32(0o777)}, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	// A chmod to the mode it has would change nothing, and is refused all
	// the same: a denied path takes no change of any kind.
	_, err = h.e.Setattr(".git/config", -1, overlay.SetAttr{Mode: u32(0o644)}, caller)
	require.ErrorIs(t, err, syscall.EACCES)
	require.ErrorIs(t, h.e.Setxattr(".git/config", "user.x", []byte("1"), 0, caller), syscall.EACCES)
	// The host's own edits are the agent's too, even without a pid.
	host := overlay.Caller{Host: true}
	err = h.e.PatchFile(".git/config", host, func([]byte, bool) ([]byte, bool, error) { return []byte("evil\n"), true, nil })
	require.ErrorIs(t, err, syscall.EACCES)
	require.Equal(t, "cfg\n", h.read(".git/config"))

	// Hidden: not there, cannot be made.
	h.requireMissing(".env")
	h.requireMissing("keys/id.pem")
	require.NotContains(t, h.names(""), ".env")
	require.NotContains(t, h.names("keys"), "id.pem")
	_, _, err = h.e.Create("new.pem", unix.O_WRONLY, 0o600, caller)
	require.ErrorIs(t, err, syscall.EACCES)

	// Everything else works; the daemon's own operations are not refused.
	h.overwrite("a.txt", "a2\n")
	require.Equal(t, []string{"modified a.txt"}, h.pending())
	require.Equal(t, ws, h.wsSnapshot())
	res := h.commit()
	require.Equal(t, []string{"a.txt"}, res.Committed)
	require.Equal(t, "a2\n", h.baseRead("a.txt"))
	require.Equal(t, "SECRET\n", h.baseRead(".env"), "hidden files stay in the workspace")
}

// PatchFile is a compare-and-swap: refused while a process has the file
// open for writing, applied otherwise.
func TestPatchFileAtomicAgainstWriters(t *testing.T) {
	h := newHarness(t)
	h.baseFile("f", "one\n")
	f, err := h.e.Open("f", unix.O_WRONLY, caller)
	require.NoError(t, err)
	err = h.e.PatchFile("f", overlay.Caller{}, func(cur []byte, ok bool) ([]byte, bool, error) {
		return []byte("two\n"), true, nil
	})
	require.ErrorIs(t, err, overlay.ErrBusy)
	h.e.Release("f", f, caller)
	var seen string
	require.NoError(t, h.e.PatchFile("f", overlay.Caller{}, func(cur []byte, ok bool) ([]byte, bool, error) {
		seen = string(cur)
		return []byte("two\n"), true, nil
	}))
	require.Equal(t, "one\n", seen)
	require.Equal(t, "two\n", h.read("f"))
	require.NoError(t, h.e.PatchFile("new", overlay.Caller{}, func(cur []byte, ok bool) ([]byte, bool, error) {
		require.False(t, ok)
		return []byte("n\n"), true, nil
	}))
	require.Equal(t, "n\n", h.read("new"))
}

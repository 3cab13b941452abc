//go:build lockorder

package overlay

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The engine's own helpers report to lockorder: taking textMu while
// holding Engine.mu, against the order, panics in this build.
func TestLockOrderIsChecked(t *testing.T) {
	e := openEngine(t, t.TempDir(), t.TempDir())
	defer e.Close()
	msg := ""
	func() {
		e.rlock()
		defer e.runlock()
		defer func() { msg, _ = recover().(string) }()
		e.rlockText()
	}()
	require.True(t, strings.HasPrefix(msg, "lock order: Engine.textMu taken while holding Engine.mu"), msg)
}

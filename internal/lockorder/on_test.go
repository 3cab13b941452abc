//go:build lockorder

package lockorder

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOrder(t *testing.T) {
	Acquire(TurnMu)
	Acquire(EngineMu)
	Acquire(Journal)
	Release(Journal)
	Acquire(Snapshots) // below Engine.mu: fine
	Release(Snapshots)
	msg := ""
	func() {
		defer func() { msg, _ = recover().(string) }()
		Acquire(TextMu) // above Engine.mu, which is held
	}()
	require.True(t, strings.HasPrefix(msg, "lock order: Engine.textMu taken while holding Engine.mu"), msg)
	Release(EngineMu)
	Acquire(TextMu) // now fine
	Release(TextMu)
	Release(TurnMu)
	done := make(chan struct{})
	go func() { // another goroutine holds nothing
		defer close(done)
		Acquire(ChangeGate)
		Release(ChangeGate)
	}()
	<-done
}

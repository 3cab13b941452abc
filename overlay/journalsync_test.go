package overlay_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// countingJournal records how the engine appends.
type countingJournal struct {
	mu            sync.Mutex
	waited, early int // Append (durable) and AppendNoWait calls
	syncs         int
}

func (j *countingJournal) Append(b []byte) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.waited++
	return uint64(j.waited + j.early), nil
}

func (j *countingJournal) AppendNoWait(b []byte) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.early++
	return uint64(j.waited + j.early), nil
}

func (j *countingJournal) Sync() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.syncs++
	return nil
}

func (j *countingJournal) counts() (waited, early, syncs int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.waited, j.early, j.syncs
}

// By default every staging record is durable before the operation
// returns; with JournalSync the staging records are written at once and
// synced by a ticker, while commit's intent stays durable first.
func TestJournalSyncInterval(t *testing.T) {
	for _, interval := range []time.Duration{0, 20 * time.Millisecond} {
		h := newHarness(t)
		j := &countingJournal{}
		h.opts.Journal, h.opts.JournalSync = j, interval
		h.restart()
		h.baseFile("a.txt", "a\n")
		h.create("new.txt", "n\n")
		h.mkdir("d")
		h.unlink("a.txt")
		waited, early, _ := j.counts()
		if interval == 0 {
			require.GreaterOrEqual(t, waited, 3, "create, mkdir and unlink are durable before they return")
		} else {
			require.Zero(t, waited, "no staging record waits for a sync")
			require.GreaterOrEqual(t, early, 3)
			require.Eventually(t, func() bool { _, _, s := j.counts(); return s > 0 }, 2*time.Second, 5*time.Millisecond, "the ticker syncs the journal")
		}
		before, _, _ := j.counts()
		h.commit()
		after, _, _ := j.counts()
		require.Greater(t, after, before, "commit's intent is durable before the commit")
		require.NoError(t, h.e.Close())
		h.e = nil
	}
}

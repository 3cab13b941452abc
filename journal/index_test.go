package journal

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// scanFrom returns the seqs Scan gives for since.
func scanFrom(t *testing.T, j *Journal, since uint64) []uint64 {
	t.Helper()
	var seqs []uint64
	require.NoError(t, j.Scan(since, func(r Record) error {
		require.Equal(t, string(payloadFor(int(r.Seq))), string(r.Payload), "payload of %d", r.Seq)
		seqs = append(seqs, r.Seq)
		return nil
	}))
	return seqs
}

func seqRange(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

// Scans from any sequence number give exactly the records after it,
// before and after a checkpoint, across reopens, with the index in use.
func TestIndexedScanAndCheckpoint(t *testing.T) {
	path := testPath(t)
	j, _ := openJournal(t, path, Options{NoSync: true})
	const n = 3*indexEvery + 17
	for i := 1; i <= n; i++ {
		_, err := j.Append(payloadFor(i))
		require.NoError(t, err)
	}
	require.Len(t, j.marks, 4)
	for _, since := range []uint64{0, 1, indexEvery - 1, indexEvery, indexEvery + 1, 2*indexEvery + 5, n - 1, n, n + 5} {
		want := seqRange(since+1, n)
		require.Equal(t, want, scanFrom(t, j, since), "since %d", since)
	}
	require.NoError(t, j.Checkpoint())
	for i := n + 1; i <= n+10; i++ {
		_, err := j.Append(payloadFor(i))
		require.NoError(t, err)
	}
	require.NoError(t, j.Close())

	// The reopen reads only the ten records after the checkpoint.
	j, info := openJournal(t, path, Options{NoSync: true})
	require.Equal(t, uint64(n), info.CheckpointSeq)
	require.Equal(t, 10, info.Records)
	require.Equal(t, uint64(n+10), info.LastSeq)
	for _, since := range []uint64{0, indexEvery + 3, n - 2, n, n + 9} {
		require.Equal(t, seqRange(since+1, n+10), scanFrom(t, j, since), "since %d after reopen", since)
	}
	seq, err := j.Append(payloadFor(n + 11))
	require.NoError(t, err)
	require.Equal(t, uint64(n+11), seq)
	require.NoError(t, j.Close())
}

// A checkpoint that does not fit the file is ignored: the whole journal
// is read, as without one.
func TestCheckpointThatDoesNotFit(t *testing.T) {
	for name, damage := range map[string]func(path string){
		"garbage":    func(path string) { os.WriteFile(path+".ckpt", []byte("{not json"), 0o600) },
		"past end":   func(path string) { os.WriteFile(path+".ckpt", []byte(`{"off":99999999,"seq":5}`), 0o600) },
		"wrong seq":  func(path string) { os.WriteFile(path+".ckpt", []byte(`{"off":8,"seq":3}`), 0o600) },
		"mid record": func(path string) { os.WriteFile(path+".ckpt", []byte(`{"off":20,"seq":1}`), 0o600) },
		"journal truncated below it": func(path string) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, data[:len(data)/2], 0o600))
		},
	} {
		t.Run(name, func(t *testing.T) {
			path := testPath(t)
			j, _ := openJournal(t, path, Options{NoSync: true})
			for i := 1; i <= 50; i++ {
				_, err := j.Append(payloadFor(i))
				require.NoError(t, err)
			}
			require.NoError(t, j.Checkpoint())
			require.NoError(t, j.Close())
			damage(path)
			j, info, err := Open(path, Options{NoSync: true})
			if err != nil {
				return // a truncated journal may be refused as corrupt: never trusted
			}
			defer j.Close()
			require.Zero(t, info.CheckpointSeq, "a damaged checkpoint was used")
			require.Equal(t, seqRange(1, info.LastSeq), scanFrom(t, j, 0))
		})
	}
}

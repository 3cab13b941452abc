package journal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testPath returns a journal path in a fresh temporary directory.
func testPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "meta.journal")
}

func openJournal(t *testing.T, path string, opts Options) (*Journal, RecoverInfo) {
	t.Helper()
	j, info, err := Open(path, opts)
	require.NoError(t, err)
	return j, info
}

// payloadFor gives each test record a distinct payload, JSON-like as in stagefs.
func payloadFor(i int) []byte {
	return []byte(fmt.Sprintf(`{"op":"write","path":"/dir/file-%d","n":%d}`, i, i*7))
}

// writeJournal creates a journal at path holding n records made by payloadFor
// and returns the file's bytes.
func writeJournal(t *testing.T, path string, n int) []byte {
	t.Helper()
	j, _ := openJournal(t, path, Options{NoSync: true})
	for i := 1; i <= n; i++ {
		seq, err := j.Append(payloadFor(i))
		require.NoError(t, err)
		require.Equal(t, uint64(i), seq)
	}
	require.NoError(t, j.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// frameOffsets returns where each frame of a journal file's bytes starts.
func frameOffsets(t *testing.T, data []byte) []int64 {
	t.Helper()
	var offs []int64
	off := fileHeaderLen
	for off < int64(len(data)) {
		_, n, err := Decode(data[off:])
		require.NoError(t, err, "frame at offset %d", off)
		offs = append(offs, off)
		off += int64(n)
	}
	return offs
}

// scanAll returns every record in the journal.
func scanAll(t *testing.T, j *Journal) []Record {
	t.Helper()
	var recs []Record
	require.NoError(t, j.Scan(0, func(r Record) error {
		recs = append(recs, r)
		return nil
	}))
	return recs
}

// requireRecords checks that recs are records 1..n with payloadFor payloads.
func requireRecords(t *testing.T, recs []Record, n int) {
	t.Helper()
	require.Len(t, recs, n)
	for i, r := range recs {
		require.Equal(t, uint64(i+1), r.Seq)
		require.Equal(t, payloadFor(i+1), r.Payload)
	}
}

func TestAppendReopenScanRoundTrip(t *testing.T) {
	path := testPath(t)
	j, info := openJournal(t, path, Options{})
	require.Equal(t, RecoverInfo{}, info)

	payloads := [][]byte{[]byte(`{"a":1}`), {}, bytes.Repeat([]byte("x"), 100000), []byte("\x00\xff binary")}
	for i, p := range payloads {
		seq, err := j.Append(p)
		require.NoError(t, err)
		require.Equal(t, uint64(i+1), seq)
	}
	size := j.Size()
	require.NoError(t, j.Close())

	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, size, st.Size())

	j, info = openJournal(t, path, Options{})
	defer j.Close()
	require.Equal(t, RecoverInfo{Records: len(payloads), LastSeq: uint64(len(payloads))}, info)
	require.Equal(t, size, j.Size())
	recs := scanAll(t, j)
	require.Len(t, recs, len(payloads))
	for i, r := range recs {
		require.Equal(t, uint64(i+1), r.Seq)
		require.Equal(t, payloads[i], r.Payload)
	}
}

func TestSeqContinuesAfterReopen(t *testing.T) {
	path := testPath(t)
	writeJournal(t, path, 3)

	j, info := openJournal(t, path, Options{})
	require.Equal(t, uint64(3), info.LastSeq)
	require.Equal(t, uint64(3), j.LastSeq())
	seq, err := j.Append(payloadFor(4))
	require.NoError(t, err)
	require.Equal(t, uint64(4), seq)
	seq, err = j.AppendNoWait(payloadFor(5))
	require.NoError(t, err)
	require.Equal(t, uint64(5), seq)
	require.NoError(t, j.Close())

	j, info = openJournal(t, path, Options{})
	defer j.Close()
	require.Equal(t, 5, info.Records)
	requireRecords(t, scanAll(t, j), 5)
}

func TestOpenCreatesMissingFileWithHeader(t *testing.T) {
	path := testPath(t)
	j, info := openJournal(t, path, Options{})
	require.Equal(t, RecoverInfo{}, info)
	require.Equal(t, fileHeaderLen, j.Size())
	require.Equal(t, uint64(0), j.LastSeq())
	require.Empty(t, scanAll(t, j))
	require.NoError(t, j.Close())

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, fileHeader[:], data)
}

func TestOpenMissingDirectoryFails(t *testing.T) {
	_, _, err := Open(filepath.Join(t.TempDir(), "no", "such", "dir", "j"), Options{})
	require.Error(t, err)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestEmptyFileGetsHeader(t *testing.T) {
	path := testPath(t)
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	j, info := openJournal(t, path, Options{})
	require.Equal(t, RecoverInfo{}, info)
	_, err := j.Append(payloadFor(1))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	j, info = openJournal(t, path, Options{})
	defer j.Close()
	require.Equal(t, 1, info.Records)
	requireRecords(t, scanAll(t, j), 1)
}

func TestPartialHeaderIsRewritten(t *testing.T) {
	path := testPath(t)
	require.NoError(t, os.WriteFile(path, fileHeader[:5], 0o600))
	j, info := openJournal(t, path, Options{})
	require.Equal(t, RecoverInfo{}, info)
	require.NoError(t, j.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, fileHeader[:], data)
}

func TestBadHeaderIsRefused(t *testing.T) {
	cases := map[string]struct {
		content []byte
		want    string
	}{
		"foreign text":  {[]byte("hello, this is not a journal\n"), "not a stagefs journal"},
		"short foreign": {[]byte("{}"), "not a stagefs journal"},
		"other version": {append([]byte("SFSJ\x02\x00\x00\x00"), encodeFrame(1, []byte("x"))...), "unsupported journal format version 2"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := testPath(t)
			require.NoError(t, os.WriteFile(path, tc.content, 0o600))
			_, _, err := Open(path, Options{})
			require.Error(t, err)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, path)
			var ce *CorruptError
			require.False(t, errors.As(err, &ce), "a foreign file is not a corrupt journal")

			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, tc.content, data, "a refused file must not be modified")
			require.NoFileExists(t, path+".broken")
		})
	}
}

func TestConcurrentAppends(t *testing.T) {
	const goroutines, perG = 16, 40
	path := testPath(t)
	j, _ := openJournal(t, path, Options{})

	var mu sync.Mutex
	bySeq := map[uint64][]byte{}
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perG; i++ {
				p := []byte(fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))
				var seq uint64
				var err error
				if i%5 == 4 {
					// Mix in unsynced appends; the next Append covers them.
					seq, err = j.AppendNoWait(p)
				} else {
					seq, err = j.Append(p)
				}
				if !assertNoError(t, err) {
					return
				}
				mu.Lock()
				_, dup := bySeq[seq]
				bySeq[seq] = p
				mu.Unlock()
				if dup {
					t.Errorf("seq %d returned twice", seq)
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, bySeq, goroutines*perG)
	require.Equal(t, uint64(goroutines*perG), j.LastSeq())
	require.NoError(t, j.Close())

	j, info := openJournal(t, path, Options{})
	defer j.Close()
	require.Equal(t, goroutines*perG, info.Records)
	recs := scanAll(t, j)
	require.Len(t, recs, goroutines*perG)
	for i, r := range recs {
		require.Equal(t, uint64(i+1), r.Seq)
		require.Equal(t, bySeq[r.Seq], r.Payload, "seq %d", r.Seq)
	}
}

// assertNoError reports err from a non-test goroutine, where require's
// FailNow must not be called.
func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// TestGroupCommitSharesOneSync holds the first fdatasync open while 15 more
// Appends write their records, then checks that exactly one more fdatasync
// made all 15 durable, and that none of them returned on the first sync,
// which started before their writes.
func TestGroupCommitSharesOneSync(t *testing.T) {
	j, _ := openJournal(t, testPath(t), Options{})
	defer j.Close()

	var mu sync.Mutex
	var targets []uint64 // lastSeq seen at the start of each sync
	firstStarted := make(chan struct{})
	releaseFirst := make(chan struct{})
	j.syncFile = func(f *os.File) error {
		mu.Lock()
		// mu is not held during a group-commit sync, so LastSeq is safe here.
		targets = append(targets, j.LastSeq())
		n := len(targets)
		mu.Unlock()
		if n == 1 {
			close(firstStarted)
			<-releaseFirst
		}
		return datasync(f)
	}

	var wg sync.WaitGroup
	done := make(chan uint64, 16)
	wg.Add(1)
	go func() {
		defer wg.Done()
		seq, err := j.Append(payloadFor(1))
		assertNoError(t, err)
		done <- seq
	}()
	<-firstStarted
	for i := 2; i <= 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq, err := j.Append(payloadFor(i))
			assertNoError(t, err)
			done <- seq
		}()
	}
	// All 15 records get written while the first sync is still running.
	require.Eventually(t, func() bool { return j.LastSeq() == 16 }, 10*time.Second, time.Millisecond)
	require.Empty(t, done, "no Append may return before its record is synced")

	close(releaseFirst)
	wg.Wait()
	close(done)
	var seqs []uint64
	for s := range done {
		seqs = append(seqs, s)
	}
	require.Len(t, seqs, 16)
	require.ElementsMatch(t, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, seqs)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []uint64{1, 16}, targets, "one sync for record 1, one shared by the other 15")
}

func TestSyncErrorIsStickyAndReachesEveryWaiter(t *testing.T) {
	path := testPath(t)
	j, _ := openJournal(t, path, Options{})

	_, err := j.Append(payloadFor(1))
	require.NoError(t, err)

	j.syncFile = func(*os.File) error { return syscall.EIO }
	_, err = j.Append(payloadFor(2))
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorContains(t, err, "fdatasync failed")
	require.ErrorContains(t, err, "refuses further appends")

	// Nothing more is accepted, even if fsync would work again.
	j.syncFile = datasync
	_, err = j.Append(payloadFor(3))
	require.ErrorIs(t, err, syscall.EIO)
	_, err = j.AppendNoWait(payloadFor(3))
	require.ErrorIs(t, err, syscall.EIO)
	require.ErrorIs(t, j.Sync(), syscall.EIO)
	require.ErrorIs(t, j.Close(), syscall.EIO)

	// Reopening recovers what is in the file: record 2 was written, only its
	// sync failed (and here the data did reach the file).
	j, info := openJournal(t, path, Options{})
	defer j.Close()
	require.Equal(t, 2, info.Records)
}

func TestSyncErrorWithConcurrentWaiters(t *testing.T) {
	j, _ := openJournal(t, testPath(t), Options{})
	defer j.Close()
	started := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	j.syncFile = func(*os.File) error {
		once.Do(func() { close(started) })
		<-release
		return syscall.EIO
	}
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := j.Append(payloadFor(i))
			errs <- err
		}()
	}
	<-started
	require.Eventually(t, func() bool { return j.LastSeq() == 8 }, 10*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, syscall.EIO)
	}
}

func TestAppendNoWaitBecomesDurableOnSync(t *testing.T) {
	path := testPath(t)
	j, _ := openJournal(t, path, Options{})
	var syncs int
	j.syncFile = func(f *os.File) error {
		syncs++ // only called with no other goroutine around
		return datasync(f)
	}
	for i := 1; i <= 3; i++ {
		seq, err := j.AppendNoWait(payloadFor(i))
		require.NoError(t, err)
		require.Equal(t, uint64(i), seq)
	}
	require.Equal(t, 0, syncs, "AppendNoWait must not sync")
	// Scan sees written records before they are durable.
	requireRecords(t, scanAll(t, j), 3)

	require.NoError(t, j.Sync())
	require.Equal(t, 1, syncs)
	require.NoError(t, j.Sync())
	require.Equal(t, 1, syncs, "Sync with nothing new does not sync again")

	_, err := j.AppendNoWait(payloadFor(4))
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.Equal(t, 2, syncs, "Close syncs unsynced records")

	j, info := openJournal(t, path, Options{})
	defer j.Close()
	require.Equal(t, 4, info.Records)
	requireRecords(t, scanAll(t, j), 4)
}

func TestTornTailAtEveryOffsetOfLastFrame(t *testing.T) {
	dir := t.TempDir()
	orig := writeJournal(t, filepath.Join(dir, "orig"), 4)
	offs := frameOffsets(t, orig)
	last := offs[len(offs)-1]

	for cut := last + 1; cut < int64(len(orig)); cut++ {
		path := filepath.Join(dir, fmt.Sprintf("cut-%d", cut))
		require.NoError(t, os.WriteFile(path, orig[:cut], 0o600))

		j, info, err := Open(path, Options{NoSync: true})
		require.NoError(t, err, "cut at %d", cut)
		require.Equal(t, 3, info.Records, "cut at %d", cut)
		require.Equal(t, uint64(3), info.LastSeq)
		require.Equal(t, cut-last, info.TornBytes)
		require.Equal(t, path+".broken", info.BrokenCopy)
		broken, err := os.ReadFile(info.BrokenCopy)
		require.NoError(t, err)
		require.Equal(t, orig[last:cut], broken, "the copy holds exactly the cut bytes")
		require.Equal(t, last, j.Size())
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, last, st.Size(), "file truncated to the last good frame")

		seq, err := j.Append(payloadFor(4))
		require.NoError(t, err)
		require.Equal(t, uint64(4), seq)
		require.NoError(t, j.Close())

		j, info, err = Open(path, Options{NoSync: true})
		require.NoError(t, err)
		require.Equal(t, RecoverInfo{Records: 4, LastSeq: 4}, info)
		requireRecords(t, scanAll(t, j), 4)
		require.NoError(t, j.Close())
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, orig, data, "re-appending the lost record restores the same bytes")
	}
}

func TestTornFirstFrameAndPartialFrameHeader(t *testing.T) {
	dir := t.TempDir()
	orig := writeJournal(t, filepath.Join(dir, "orig"), 1)
	// Cut inside the only frame, header included: nothing valid remains.
	for _, cut := range []int64{fileHeaderLen + 1, fileHeaderLen + 3, fileHeaderLen + 10, fileHeaderLen + frameHeaderLen} {
		path := filepath.Join(dir, fmt.Sprintf("cut-%d", cut))
		require.NoError(t, os.WriteFile(path, orig[:cut], 0o600))
		j, info, err := Open(path, Options{NoSync: true})
		require.NoError(t, err)
		require.Equal(t, 0, info.Records)
		require.Equal(t, cut-fileHeaderLen, info.TornBytes)
		require.Equal(t, fileHeaderLen, j.Size())
		require.NoError(t, j.Close())
	}
}

func TestZeroFilledTailIsCut(t *testing.T) {
	path := testPath(t)
	orig := writeJournal(t, path, 3)
	zeros := make([]byte, 8192)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(zeros)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	j, info := openJournal(t, path, Options{})
	require.Equal(t, RecoverInfo{Records: 3, LastSeq: 3, TornBytes: int64(len(zeros)), BrokenCopy: path + ".broken"}, info)
	broken, err := os.ReadFile(path + ".broken")
	require.NoError(t, err)
	require.Equal(t, zeros, broken)
	require.Equal(t, int64(len(orig)), j.Size())
	requireRecords(t, scanAll(t, j), 3)
	require.NoError(t, j.Close())
}

func TestGarbageTailWithoutValidFrameIsCut(t *testing.T) {
	path := testPath(t)
	orig := writeJournal(t, path, 2)
	// Non-zero garbage, including a frame magic followed by a frame that does
	// not check out, is still a tail: no record can be lost by cutting it.
	garbage := append([]byte("garbage\x01\x02"), frameMagic[:]...)
	bad := encodeFrame(3, []byte("x"))
	bad[len(bad)-1] ^= 0xff
	garbage = append(garbage, bad...)
	require.NoError(t, os.WriteFile(path, append(append([]byte{}, orig...), garbage...), 0o600))

	j, info := openJournal(t, path, Options{NoSync: true})
	defer j.Close()
	require.Equal(t, 2, info.Records)
	require.Equal(t, int64(len(garbage)), info.TornBytes)
	broken, err := os.ReadFile(info.BrokenCopy)
	require.NoError(t, err)
	require.Equal(t, garbage, broken)
}

func TestBrokenCopyNamesDoNotCollide(t *testing.T) {
	path := testPath(t)
	var want []string
	for round := 0; round < 3; round++ {
		j, _ := openJournal(t, path, Options{NoSync: true})
		_, err := j.Append(payloadFor(round + 1))
		require.NoError(t, err)
		require.NoError(t, j.Close())
		// Tear the last record by dropping its final byte.
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.NoError(t, os.Truncate(path, st.Size()-1))

		j, info := openJournal(t, path, Options{NoSync: true})
		require.NoError(t, j.Close())
		name := path + ".broken"
		if round > 0 {
			name += fmt.Sprintf(".%d", round)
		}
		require.Equal(t, name, info.BrokenCopy)
		want = append(want, name)
	}
	for _, name := range want {
		require.FileExists(t, name)
	}
}

// TestFlipInMiddleRecordIsCorruption flips every byte of a middle frame in
// turn: Open must report that frame's offset and leave the file untouched.
func TestFlipInMiddleRecordIsCorruption(t *testing.T) {
	dir := t.TempDir()
	orig := writeJournal(t, filepath.Join(dir, "orig"), 5)
	offs := frameOffsets(t, orig)
	start, end := offs[2], offs[3]

	path := filepath.Join(dir, "flipped")
	for pos := start; pos < end; pos++ {
		damaged := append([]byte{}, orig...)
		damaged[pos] ^= 0x5a
		require.NoError(t, os.WriteFile(path, damaged, 0o600))

		_, _, err := Open(path, Options{NoSync: true})
		var ce *CorruptError
		require.ErrorAs(t, err, &ce, "flip at %d", pos)
		require.Equal(t, path, ce.Path)
		require.Equal(t, start, ce.Offset, "flip at %d", pos)

		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, damaged, data, "a corrupt journal must not be modified")
		require.NoFileExists(t, path+".broken")
	}
}

func TestCorruptErrorMessageTellsHowToRepair(t *testing.T) {
	path := testPath(t)
	orig := writeJournal(t, path, 3)
	offs := frameOffsets(t, orig)
	orig[offs[1]+frameHeaderLen] ^= 0xff
	require.NoError(t, os.WriteFile(path, orig, 0o600))

	_, _, err := Open(path, Options{})
	var ce *CorruptError
	require.ErrorAs(t, err, &ce)
	msg := err.Error()
	require.Contains(t, msg, path)
	require.Contains(t, msg, fmt.Sprintf("offset %d", offs[1]))
	require.Contains(t, msg, fmt.Sprintf("truncate -s %d %s", offs[1], path))
	require.Contains(t, msg, "checksum")
	require.Contains(t, msg, fmt.Sprintf("valid record follows at offset %d", offs[2]))

	// Following the advice gives a usable journal with the earlier records.
	require.NoError(t, os.Truncate(path, offs[1]))
	j, info := openJournal(t, path, Options{})
	defer j.Close()
	require.Equal(t, RecoverInfo{Records: 1, LastSeq: 1}, info)
}

func TestFlipInLastRecordPayloadIsTornTail(t *testing.T) {
	path := testPath(t)
	orig := writeJournal(t, path, 4)
	offs := frameOffsets(t, orig)
	last := offs[len(offs)-1]
	damaged := append([]byte{}, orig...)
	damaged[len(damaged)-3] ^= 0x01
	require.NoError(t, os.WriteFile(path, damaged, 0o600))

	j, info := openJournal(t, path, Options{})
	require.Equal(t, 3, info.Records)
	require.Equal(t, int64(len(orig))-last, info.TornBytes)
	broken, err := os.ReadFile(info.BrokenCopy)
	require.NoError(t, err)
	require.Equal(t, damaged[last:], broken)
	requireRecords(t, scanAll(t, j), 3)

	seq, err := j.Append(payloadFor(4))
	require.NoError(t, err)
	require.Equal(t, uint64(4), seq)
	require.NoError(t, j.Close())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, orig, data)
}

func TestSequenceGapOrRepeatIsCorruption(t *testing.T) {
	cases := map[string][]uint64{
		"gap":          {1, 2, 4, 5},
		"repeat":       {1, 2, 2, 3},
		"backwards":    {1, 2, 1},
		"not from one": {2, 3},
		"gap at end":   {1, 2, 9},
	}
	for name, seqs := range cases {
		t.Run(name, func(t *testing.T) {
			path := testPath(t)
			data := append([]byte{}, fileHeader[:]...)
			var badOff int64 = -1
			want := uint64(1)
			for _, s := range seqs {
				if s != want && badOff < 0 {
					badOff = int64(len(data))
				}
				want = s + 1
				data = append(data, encodeFrame(s, payloadFor(int(s)))...)
			}
			require.NoError(t, os.WriteFile(path, data, 0o600))

			_, _, err := Open(path, Options{NoSync: true})
			var ce *CorruptError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, badOff, ce.Offset)
			require.Contains(t, ce.Reason, "sequence number")
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, data, got)
		})
	}
}

func TestScanSince(t *testing.T) {
	path := testPath(t)
	writeJournal(t, path, 10)
	j, _ := openJournal(t, path, Options{NoSync: true})
	defer j.Close()

	for _, since := range []uint64{0, 1, 5, 9, 10, 11, 1000} {
		var got []uint64
		require.NoError(t, j.Scan(since, func(r Record) error {
			require.Equal(t, payloadFor(int(r.Seq)), r.Payload)
			got = append(got, r.Seq)
			return nil
		}))
		var want []uint64
		for s := since + 1; s <= 10; s++ {
			want = append(want, s)
		}
		require.Equal(t, want, got, "since %d", since)
	}
}

func TestScanStopsOnCallbackError(t *testing.T) {
	path := testPath(t)
	writeJournal(t, path, 10)
	j, _ := openJournal(t, path, Options{NoSync: true})
	defer j.Close()

	stop := errors.New("stop here")
	var seen []uint64
	err := j.Scan(2, func(r Record) error {
		seen = append(seen, r.Seq)
		if r.Seq == 5 {
			return stop
		}
		return nil
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, []uint64{3, 4, 5}, seen)
}

func TestScanCallbackMayAppend(t *testing.T) {
	j, _ := openJournal(t, testPath(t), Options{NoSync: true})
	defer j.Close()
	for i := 1; i <= 3; i++ {
		_, err := j.Append(payloadFor(i))
		require.NoError(t, err)
	}
	var seen int
	require.NoError(t, j.Scan(0, func(r Record) error {
		seen++
		_, err := j.Append(payloadFor(int(r.Seq) + 3))
		return err
	}))
	require.Equal(t, 3, seen, "Scan stops at the size it started with")
	requireRecords(t, scanAll(t, j), 6)
}

func TestUseAfterCloseFails(t *testing.T) {
	j, _ := openJournal(t, testPath(t), Options{})
	_, err := j.Append(payloadFor(1))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	_, err = j.Append(payloadFor(2))
	require.ErrorIs(t, err, os.ErrClosed)
	_, err = j.AppendNoWait(payloadFor(2))
	require.ErrorIs(t, err, os.ErrClosed)
	require.ErrorIs(t, j.Sync(), os.ErrClosed)
	require.ErrorIs(t, j.Scan(0, func(Record) error { return nil }), os.ErrClosed)
	require.ErrorIs(t, j.Close(), os.ErrClosed)
	require.Equal(t, uint64(1), j.LastSeq())
}

func TestPayloadTooLargeIsRefusedHarmlessly(t *testing.T) {
	path := testPath(t)
	j, _ := openJournal(t, path, Options{NoSync: true})
	_, err := j.Append(make([]byte, MaxPayload+1))
	require.ErrorContains(t, err, "exceeds MaxPayload")
	require.Equal(t, uint64(0), j.LastSeq())

	// The journal still works, and a payload of exactly MaxPayload fits.
	big := bytes.Repeat([]byte{'j'}, MaxPayload)
	seq, err := j.Append(big)
	require.NoError(t, err)
	require.Equal(t, uint64(1), seq)
	require.NoError(t, j.Close())

	j, info := openJournal(t, path, Options{NoSync: true})
	defer j.Close()
	require.Equal(t, 1, info.Records)
	recs := scanAll(t, j)
	require.Len(t, recs, 1)
	require.Equal(t, big, recs[0].Payload)
}

func TestSecondOpenIsRefused(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("flock is only used on Linux and macOS")
	}
	path := testPath(t)
	j, _ := openJournal(t, path, Options{})
	_, _, err := Open(path, Options{})
	require.ErrorContains(t, err, "already in use")
	require.NoError(t, j.Close())

	j, _ = openJournal(t, path, Options{})
	require.NoError(t, j.Close())
}

func TestDecodeErrors(t *testing.T) {
	good := encodeFrame(7, []byte(`{"k":"v"}`))

	rec, n, err := Decode(append(append([]byte{}, good...), "trailing"...))
	require.NoError(t, err)
	require.Equal(t, len(good), n)
	require.Equal(t, Record{Seq: 7, Payload: []byte(`{"k":"v"}`)}, rec)

	for cut := 0; cut < len(good); cut++ {
		_, _, err := Decode(good[:cut])
		require.ErrorIs(t, err, ErrShortFrame, "cut at %d", cut)
	}

	badMagic := append([]byte{}, good...)
	badMagic[0] = '{'
	_, _, err = Decode(badMagic)
	require.ErrorIs(t, err, ErrBadFrame)
	_, _, err = Decode(badMagic[:2])
	require.ErrorIs(t, err, ErrBadFrame, "a bad magic is bad even when short")

	huge := append([]byte{}, good...)
	huge[4], huge[5], huge[6], huge[7] = 0xff, 0xff, 0xff, 0xff
	_, _, err = Decode(huge)
	require.ErrorIs(t, err, ErrBadFrame)
	_, _, err = Decode(huge[:8])
	require.ErrorIs(t, err, ErrBadFrame)

	zeroSeq := encodeFrame(0, []byte("x"))
	_, _, err = Decode(zeroSeq)
	require.ErrorIs(t, err, ErrBadFrame)

	badSum := append([]byte{}, good...)
	badSum[len(badSum)-1] ^= 1
	_, _, err = Decode(badSum)
	require.ErrorIs(t, err, ErrBadChecksum)

	badSeq := append([]byte{}, good...)
	badSeq[16] ^= 1 // the checksum covers the seq too
	_, _, err = Decode(badSeq)
	require.ErrorIs(t, err, ErrBadChecksum)

	_, _, err = Decode(make([]byte, 64))
	require.ErrorIs(t, err, ErrBadFrame, "zeros are not a frame")
}

func TestDecodedPayloadDoesNotAliasInput(t *testing.T) {
	buf := encodeFrame(1, []byte("abc"))
	rec, _, err := Decode(buf)
	require.NoError(t, err)
	buf[frameHeaderLen] = 'z'
	require.Equal(t, []byte("abc"), rec.Payload)
}

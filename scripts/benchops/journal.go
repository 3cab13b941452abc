package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"stagefs/journal"
)

// measureJournal shows that start-up and a look at the newest records cost
// what was written since the last checkpoint and what is returned, not the
// journal's length: a journal of n records, opened with its checkpoint and
// without, and scanned for its last ten records and for all of them.
func measureJournal(root string, n int) {
	dir, err := os.MkdirTemp(root, "benchjournal-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "journal.log")
	j, _, err := journal.Open(path, journal.Options{NoSync: true})
	if err != nil {
		fail(err)
	}
	for i := 0; i < n; i++ {
		if _, err := j.AppendNoWait([]byte(fmt.Sprintf(`{"op":"write","path":"dir/file-%d.txt","pid":4242,"comm":"bench"}`, i))); err != nil {
			fail(err)
		}
	}
	if err := j.Checkpoint(); err != nil {
		fail(err)
	}
	j.Close()
	open := func() time.Duration {
		s := time.Now()
		j, _, err := journal.Open(path, journal.Options{NoSync: true})
		if err != nil {
			fail(err)
		}
		d := time.Since(s)
		j.Close()
		return d
	}
	withCkpt := open()
	j, _, err = journal.Open(path, journal.Options{NoSync: true})
	if err != nil {
		fail(err)
	}
	count := func(since uint64) (time.Duration, int) {
		s, k := time.Now(), 0
		j.Scan(since, func(journal.Record) error { k++; return nil })
		return time.Since(s), k
	}
	tail, _ := count(j.LastSeq() - 10)
	all, k := count(0)
	j.Close()
	os.Remove(path + ".ckpt")
	without := open()
	fmt.Printf("journal of %d records (%d MB):\n", k, fileSize(path)>>20)
	fmt.Printf("  %-40s %9s\n", "open, after a clean close (checkpoint)", ms(withCkpt))
	fmt.Printf("  %-40s %9s\n", "open, after a crash (no checkpoint)", ms(without))
	fmt.Printf("  %-40s %9s\n", "log: the newest 10 records", ms(tail))
	fmt.Printf("  %-40s %9s\n", "log: every record", ms(all))
}

func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

package overlay

import (
	"encoding/json"
	"strings"

	"stagefs/journal"
)

// Reading the engine's records back from the journal. The journal frames
// and recovers records without knowing what they say; what they say is
// the engine's (record.go writes them), so the engine reads them too:
// for the log a host asks for, and for a commit a crash interrupted.

// ScanRecords calls fn with each of the engine's records after since,
// oldest first, that touches one of paths (or a path below one), or with
// every record when paths is empty. Payloads that are not the engine's
// records are skipped. An error from fn ends the scan and is returned.
func ScanRecords(j *journal.Journal, since uint64, paths []string, fn func(Record) error) error {
	return j.Scan(since, func(r journal.Record) error {
		rec, err := DecodeRecord(r.Seq, r.Payload)
		if err != nil {
			return nil
		}
		if len(paths) > 0 && !touches(rec, paths) {
			return nil
		}
		return fn(rec)
	})
}

// touches reports whether a record concerns one of the paths (or a path
// below one of them).
func touches(r Record, paths []string) bool {
	for _, q := range paths {
		for _, p := range []string{r.Path, r.Path2} {
			if p != "" && (q == "" || p == q || strings.HasPrefix(p, q+"/")) {
				return true
			}
		}
		if strings.Contains(r.Detail, `"`+q) {
			return true // commit and discard list their paths in Detail
		}
	}
	return false
}

// UnfinishedCommit returns the paths of the last commit the journal shows
// begun but not ended after since (a crash in the middle), for Recover to
// finish. since may be the journal's checkpoint: none is taken with a
// commit in flight.
func UnfinishedCommit(j *journal.Journal, since uint64) ([]string, error) {
	commit, _, err := Unfinished(j, since)
	return commit, err
}

// Unfinished reads the journal after since once and returns what a crash
// left half done: the paths of the last commit begun and not ended, and
// the intent of the last merge into this pending set begun and not ended
// (nil when none).
func Unfinished(j *journal.Journal, since uint64) (commit []string, merge *MergeIntent, err error) {
	err = j.Scan(since, func(r journal.Record) error {
		rec, err := DecodeRecord(r.Seq, r.Payload)
		if err != nil {
			return nil // not an engine record; nothing to finish
		}
		switch rec.Op {
		case "commit_begin":
			commit = nil
			json.Unmarshal([]byte(rec.Detail), &commit)
		case "commit_end":
			commit = nil
		case "merge_begin":
			var in MergeIntent
			if json.Unmarshal([]byte(rec.Detail), &in) == nil {
				merge = &in
			}
		case "merge_end":
			merge = nil
		}
		return nil
	})
	return commit, merge, err
}

// MergeIntent is what a merge into this engine's pending set is about to
// apply (package branch): journaled before, so that a crash in the middle
// is finished at the next start.
type MergeIntent struct {
	Branch string   `json:"branch"`
	Paths  []string `json:"paths,omitempty"`
	Force  bool     `json:"force,omitempty"`
	// Exact: Paths are the paths themselves, not what is below them too
	// (a journaled intent lists every path it applies).
	Exact bool `json:"-"`
}

// NoteMergeBegin makes the intent of a merge durable in the journal.
func (e *Engine) NoteMergeBegin(in MergeIntent) error {
	b, _ := json.Marshal(in)
	return e.record(Record{Op: "merge_begin", Detail: string(b)})
}

// NoteMergeEnd records that the merge begun last has ended.
func (e *Engine) NoteMergeEnd(summary string) error {
	return e.record(Record{Op: "merge_end", Detail: summary})
}

package backend

// session/log: the journal's records as the engine reads them back, one
// page at a time.

import (
	"context"
	"errors"
	"time"

	"stagefs/control"
	"stagefs/overlay"
)

func (b *Backend) Log(ctx context.Context, p control.LogParams) (control.LogResult, error) {
	rel, err := b.relPaths(p.Paths)
	if err != nil {
		return control.LogResult{}, err
	}
	res := control.LogResult{Records: []control.LogEntry{}}
	since := p.Since
	jr := b.cfg.Journal
	if p.Tail > 0 && len(rel) == 0 && jr.LastSeq() > uint64(p.Tail) {
		// The newest records of the whole journal: no need to read it all.
		since = max(since, jr.LastSeq()-uint64(p.Tail))
	}
	err = overlay.ScanRecords(jr, since, rel, func(rec overlay.Record) error {
		res.Records = append(res.Records, control.LogEntry{
			Seq: rec.Seq, Time: time.Unix(0, rec.Time).UTC().Format(time.RFC3339Nano), Op: rec.Op,
			Path: rec.Path, Path2: rec.Path2, PID: rec.Pid, Comm: rec.Comm, Size: rec.Size, Mode: rec.Mode, Detail: rec.Detail,
		})
		if p.Tail > 0 && len(res.Records) > p.Tail {
			res.Records = res.Records[1:] // keep the newest
		}
		if p.Limit > 0 && len(res.Records) == p.Limit {
			return errPageFull
		}
		return nil
	})
	if errors.Is(err, errPageFull) {
		err = nil
	}
	return res, err
}

// errPageFull ends a journal scan once a page of the log is full.
var errPageFull = errors.New("page full")

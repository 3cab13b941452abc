package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// recover checks the file header, reads every frame, cuts a torn tail or
// reports corruption, and leaves j.size at the end of the last valid record.
func (j *Journal) recover() (RecoverInfo, error) {
	st, err := j.f.Stat()
	if err != nil {
		return RecoverInfo{}, fmt.Errorf("journal %s: %w", j.path, err)
	}
	size, err := j.prepareHeader(st.Size())
	if err != nil {
		return RecoverInfo{}, err
	}

	var info RecoverInfo
	from := fileHeaderLen
	if c, ok := j.loadCheckpoint(size); ok {
		// What came before was read whole at a clean close or start.
		from, info.LastSeq, info.CheckpointSeq = c.Off, c.Seq, c.Seq
		j.marks = c.Marks
	}
	fr := newFrameReader(io.NewSectionReader(j.f, from, size-from), from)
	for {
		start := fr.off
		rec, err := fr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if !isFrameError(err) {
				return RecoverInfo{}, fmt.Errorf("journal %s: read at offset %d: %w", j.path, start, err)
			}
			if err := j.handleDamage(start, size, err, &info); err != nil {
				return RecoverInfo{}, err
			}
			size = start
			break
		}
		if want := info.LastSeq + 1; rec.Seq != want {
			return RecoverInfo{}, &CorruptError{
				Path:   j.path,
				Offset: start,
				Reason: fmt.Sprintf("record has sequence number %d, expected %d", rec.Seq, want),
			}
		}
		info.Records++
		info.LastSeq = rec.Seq
		j.noteMark(rec.Seq, start)
	}
	j.size = size

	// The records may sit only in the page cache of a process that crashed;
	// make them durable before they are reported as such.
	if err := j.fsync("after recovery", func() error { return j.syncFile(j.f) }); err != nil {
		return RecoverInfo{}, err
	}
	return info, nil
}

// prepareHeader checks the file header, or writes it when the file is empty or
// holds only the start of a header (a crash during creation). It returns the
// file size afterwards.
func (j *Journal) prepareHeader(size int64) (int64, error) {
	if size >= fileHeaderLen {
		var got [fileHeaderLen]byte
		if _, err := j.f.ReadAt(got[:], 0); err != nil {
			return 0, fmt.Errorf("journal %s: read header: %w", j.path, err)
		}
		if !bytes.Equal(got[0:4], fileHeader[0:4]) {
			return 0, j.foreignError(got[:])
		}
		if v := binary.LittleEndian.Uint32(got[4:8]); v != fileVersion {
			return 0, fmt.Errorf("journal %s: unsupported journal format version %d (this build reads version %d)",
				j.path, v, fileVersion)
		}
		return size, nil
	}

	got := make([]byte, size)
	if _, err := j.f.ReadAt(got, 0); err != nil {
		return 0, fmt.Errorf("journal %s: read header: %w", j.path, err)
	}
	if !bytes.Equal(got, fileHeader[:size]) {
		return 0, j.foreignError(got)
	}
	if size > 0 {
		if err := j.f.Truncate(0); err != nil {
			return 0, fmt.Errorf("journal %s: %w", j.path, err)
		}
	}
	if _, err := j.f.Write(fileHeader[:]); err != nil {
		return 0, fmt.Errorf("journal %s: write header: %w", j.path, err)
	}
	if err := j.fsync("header", j.f.Sync); err != nil {
		return 0, err
	}
	// Whether Open just created the file or found it empty after a crash
	// during creation, its directory entry is not known to be durable yet.
	if err := j.fsync("directory", func() error { return syncDir(filepath.Dir(j.path)) }); err != nil {
		return 0, err
	}
	return fileHeaderLen, nil
}

func (j *Journal) foreignError(got []byte) error {
	return fmt.Errorf("journal %s: not a stagefs journal (file starts with %q, want %q); refusing to use it",
		j.path, got, fileHeader[:])
}

// handleDamage decides what the undecodable frame at off is. If a valid frame
// starts anywhere after it, records were written after the damage and it
// returns a *CorruptError without touching the file. Otherwise the bytes from
// off to size are a torn tail: they are saved to a .broken file, then cut.
func (j *Journal) handleDamage(off, size int64, cause error, info *RecoverInfo) error {
	next, found, err := findValidFrame(j.f, off+1, size)
	if err != nil {
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	if found {
		return &CorruptError{
			Path:   j.path,
			Offset: off,
			Reason: fmt.Sprintf("%v, and a valid record follows at offset %d", cause, next),
		}
	}

	broken, err := j.saveBroken(off, size)
	if err != nil {
		return err
	}
	// Only cut once the copy is durable, so a crash here loses nothing.
	if err := j.f.Truncate(off); err != nil {
		return fmt.Errorf("journal %s: truncate torn tail: %w", j.path, err)
	}
	if err := j.fsync("after truncate", j.f.Sync); err != nil {
		return err
	}
	info.TornBytes = size - off
	info.BrokenCopy = broken
	return nil
}

// saveBroken copies the bytes from off to size into the first free name of
// PATH.broken, PATH.broken.1, PATH.broken.2, ... and makes it durable.
func (j *Journal) saveBroken(off, size int64) (string, error) {
	const maxCopies = 10000 // only to bound the loop; never reached in practice
	for i := 0; i < maxCopies; i++ {
		name := j.path + ".broken"
		if i > 0 {
			name += "." + strconv.Itoa(i)
		}
		bf, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, filePerm)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("journal %s: save torn tail: %w", j.path, err)
		}
		_, err = io.Copy(bf, io.NewSectionReader(j.f, off, size-off))
		if err == nil {
			err = j.fsync("torn tail copy", bf.Sync)
		}
		if cerr := bf.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = j.fsync("directory", func() error { return syncDir(filepath.Dir(name)) })
		}
		if err != nil {
			// Leave no half copy behind; the journal itself is not cut.
			os.Remove(name)
			return "", fmt.Errorf("journal %s: save torn tail to %s: %w", j.path, name, err)
		}
		return name, nil
	}
	return "", fmt.Errorf("journal %s: save torn tail: %s.broken.1 to .%d all exist", j.path, j.path, maxCopies-1)
}

// findValidFrame looks for a frame that decodes without error starting at any
// offset in [from, size). It reads the file in blocks and only decodes where
// the frame magic appears, so a long damaged region costs one pass.
func findValidFrame(f *os.File, from, size int64) (int64, bool, error) {
	const block = 64 << 10
	// Each read overlaps the next block by len(frameMagic)-1 bytes so a magic
	// that straddles two blocks is still seen, exactly once.
	buf := make([]byte, block+len(frameMagic)-1)
	var frame []byte
	for start := from; start < size; start += block {
		n := min(int64(len(buf)), size-start)
		chunk := buf[:n]
		if _, err := f.ReadAt(chunk, start); err != nil && err != io.EOF {
			return 0, false, err
		}
		for i := 0; i < len(chunk); {
			k := bytes.Index(chunk[i:], frameMagic[:])
			if k < 0 {
				break
			}
			p := start + int64(i+k)
			ok, err := validFrameAt(f, p, size, &frame)
			if err != nil {
				return 0, false, err
			}
			if ok {
				return p, true, nil
			}
			i += k + 1
		}
	}
	return 0, false, nil
}

// validFrameAt tells whether a whole, valid frame starts at p and ends by size.
// scratch is a reusable buffer.
func validFrameAt(f *os.File, p, size int64, scratch *[]byte) (bool, error) {
	if size-p < frameHeaderLen {
		return false, nil
	}
	var hdr [frameHeaderLen]byte
	if _, err := f.ReadAt(hdr[:], p); err != nil {
		return false, err
	}
	length, _, _, err := parseHeader(hdr[:])
	if err != nil {
		return false, nil
	}
	total := int64(frameHeaderLen) + int64(length)
	if size-p < total {
		return false, nil
	}
	if int64(cap(*scratch)) < total {
		*scratch = make([]byte, total)
	}
	frame := (*scratch)[:total]
	if _, err := f.ReadAt(frame, p); err != nil {
		return false, err
	}
	_, _, err = Decode(frame)
	return err == nil, nil
}

package journal

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"
)

// MaxPayload is the largest payload a frame may carry. A length field above it
// can only come from damage, which lets recovery reject it without reading on.
const MaxPayload = 16 << 20

// Errors returned by Decode. They are wrapped with details, so test them with
// errors.Is.
var (
	// ErrShortFrame means the buffer holds only the beginning of a frame.
	ErrShortFrame = errors.New("journal: short frame")
	// ErrBadChecksum means the frame's checksum does not match its contents.
	ErrBadChecksum = errors.New("journal: bad frame checksum")
	// ErrBadFrame means the frame header is impossible (bad magic, length
	// over MaxPayload, sequence number 0).
	ErrBadFrame = errors.New("journal: bad frame")
)

const (
	// frameHeaderLen is magic(4) + length(4) + checksum(8) + seq(8).
	frameHeaderLen = 24
	// checksumStart is where the checksummed bytes (seq, then payload) begin.
	checksumStart = 16
)

// frameMagic opens every frame. 0xF5 never occurs in UTF-8, so JSON payloads
// can not contain a frame; the last byte is the frame format version.
var frameMagic = [4]byte{0xF5, 'S', 'F', 0x01}

// Record is one decoded record.
type Record struct {
	Seq     uint64 // assigned by Append, strictly increasing from 1, survives reopen
	Payload []byte
}

// encodeFrame returns the complete frame for one record.
func encodeFrame(seq uint64, payload []byte) []byte {
	buf := make([]byte, frameHeaderLen+len(payload))
	copy(buf[0:4], frameMagic[:])
	binary.LittleEndian.PutUint32(buf[4:8], uint32(len(payload)))
	binary.LittleEndian.PutUint64(buf[16:24], seq)
	copy(buf[frameHeaderLen:], payload)
	// Seq and payload are contiguous, so one hash call covers both.
	binary.LittleEndian.PutUint64(buf[8:16], xxhash.Sum64(buf[checksumStart:]))
	return buf
}

// parseHeader checks a complete frame header (at least frameHeaderLen bytes)
// and returns the payload length, stored checksum and sequence number.
func parseHeader(hdr []byte) (length uint32, sum uint64, seq uint64, err error) {
	if !bytes.Equal(hdr[0:4], frameMagic[:]) {
		return 0, 0, 0, fmt.Errorf("%w: magic %x, want %x", ErrBadFrame, hdr[0:4], frameMagic[:])
	}
	length = binary.LittleEndian.Uint32(hdr[4:8])
	if length > MaxPayload {
		return 0, 0, 0, fmt.Errorf("%w: payload length %d exceeds %d", ErrBadFrame, length, MaxPayload)
	}
	sum = binary.LittleEndian.Uint64(hdr[8:16])
	seq = binary.LittleEndian.Uint64(hdr[16:24])
	if seq == 0 {
		return 0, 0, 0, fmt.Errorf("%w: sequence number 0", ErrBadFrame)
	}
	return length, sum, seq, nil
}

// checkPartialHeader classifies a buffer shorter than a frame header: it is a
// short frame if what is there could still be the start of a valid frame,
// and a bad frame if it already can not be.
func checkPartialHeader(buf []byte) error {
	n := min(len(buf), len(frameMagic))
	if !bytes.Equal(buf[:n], frameMagic[:n]) {
		return fmt.Errorf("%w: magic %x, want %x", ErrBadFrame, buf[:n], frameMagic[:n])
	}
	if len(buf) >= 8 {
		if length := binary.LittleEndian.Uint32(buf[4:8]); length > MaxPayload {
			return fmt.Errorf("%w: payload length %d exceeds %d", ErrBadFrame, length, MaxPayload)
		}
	}
	return ErrShortFrame
}

// Decode decodes one frame at the start of buf. It returns the record, the
// frame's total length, or an error: ErrShortFrame when buf holds only part of
// a frame, ErrBadChecksum, or ErrBadFrame for an impossible header. The
// returned payload is a copy and does not alias buf. Decode never panics.
func Decode(buf []byte) (Record, int, error) {
	if len(buf) < frameHeaderLen {
		return Record{}, 0, checkPartialHeader(buf)
	}
	length, sum, seq, err := parseHeader(buf)
	if err != nil {
		return Record{}, 0, err
	}
	// length <= MaxPayload, so this can not overflow an int.
	total := frameHeaderLen + int(length)
	if len(buf) < total {
		return Record{}, 0, ErrShortFrame
	}
	if got := xxhash.Sum64(buf[checksumStart:total]); got != sum {
		return Record{}, 0, fmt.Errorf("%w: stored %016x, computed %016x", ErrBadChecksum, sum, got)
	}
	payload := make([]byte, length)
	copy(payload, buf[frameHeaderLen:total])
	return Record{Seq: seq, Payload: payload}, total, nil
}

// isFrameError tells a damaged frame apart from an I/O error.
func isFrameError(err error) bool {
	return errors.Is(err, ErrShortFrame) || errors.Is(err, ErrBadChecksum) || errors.Is(err, ErrBadFrame)
}

// frameReader reads consecutive frames from a stream without holding the
// whole file in memory.
type frameReader struct {
	r   *bufio.Reader
	off int64  // file offset of the next frame
	buf []byte // reused frame buffer
}

func newFrameReader(r io.Reader, off int64) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, 64<<10), off: off}
}

// grow returns fr.buf resized to n bytes, keeping its current contents.
func (fr *frameReader) grow(n int) []byte {
	if cap(fr.buf) < n {
		nb := make([]byte, n)
		copy(nb, fr.buf)
		fr.buf = nb
	}
	fr.buf = fr.buf[:n]
	return fr.buf
}

// next reads the frame at fr.off and advances past it. It returns io.EOF at a
// clean end (exactly at a frame boundary). An error for which isFrameError is
// true describes a damaged frame starting at fr.off, which is then left
// unchanged; any other error is an I/O error.
func (fr *frameReader) next() (Record, error) {
	hdr := fr.grow(frameHeaderLen)
	n, err := io.ReadFull(fr.r, hdr)
	switch {
	case err == io.EOF:
		return Record{}, io.EOF
	case err == io.ErrUnexpectedEOF:
		// Let Decode say whether the partial header is short or already bad.
		_, _, derr := Decode(hdr[:n])
		return Record{}, derr
	case err != nil:
		return Record{}, err
	}
	length, _, _, err := parseHeader(hdr)
	if err != nil {
		return Record{}, err
	}
	frame := fr.grow(frameHeaderLen + int(length))
	if _, err := io.ReadFull(fr.r, frame[frameHeaderLen:]); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return Record{}, ErrShortFrame
		}
		return Record{}, err
	}
	rec, total, err := Decode(frame)
	if err != nil {
		return Record{}, err
	}
	fr.off += int64(total)
	return rec, nil
}

package fuseuring

import (
	"bytes"
	"encoding/binary"
	"syscall"
	"testing"
)

func TestParseCPUs(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-1": 2, "0-3,8": 5, "0-3,8-11": 8, "2,4,6": 3} {
		got, err := parseCPUs(list)
		if err != nil || len(got) != want {
			t.Errorf("parseCPUs(%q) = %v, %v; want %d CPUs", list, got, err, want)
		}
	}
	if got, _ := parseCPUs("0-3,8"); !got[8] || got[4] {
		t.Errorf("parseCPUs(0-3,8) = %v", got)
	}
	for _, bad := range []string{"", "a", "3-1", "0-", "-1", "0,,1", "1-x", "0-999999999"} {
		if cpus, err := parseCPUs(bad); err == nil {
			t.Errorf("parseCPUs(%q) = %v, want an error", bad, cpus)
		}
	}
}

func FuzzParseCPUs(f *testing.F) {
	for _, s := range []string{"0", "0-1", "0-3,8", "", "3-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		if cpus, err := parseCPUs(list); err == nil && len(cpus) < 1 {
			t.Fatalf("parseCPUs(%q) = %v without an error", list, cpus)
		}
	})
}

// request fills an entry's buffers as the kernel does: the in header, the
// operation's header, the payload and the entry's commit id and payload
// size.
func request(e *entry, unique uint64, op, payload []byte) {
	clear(e.header)
	binary.NativeEndian.PutUint32(e.header[headerInOut:], uint32(inHeaderSize+len(op)+len(payload)))
	binary.NativeEndian.PutUint32(e.header[headerInOut+4:], 15) // an opcode
	binary.NativeEndian.PutUint64(e.header[headerInOut+8:], unique)
	copy(e.header[headerOpIn:], op)
	copy(e.payload, payload)
	binary.NativeEndian.PutUint64(e.header[entCommitID:], unique)
	binary.NativeEndian.PutUint32(e.header[entPayloadSize:], uint32(len(payload)))
}

func testEntry() *entry {
	return &entry{header: make([]byte, headerSize), payload: make([]byte, 2*minPayload)}
}

func outHeader(e *entry) (length uint32, errno int32, unique uint64, payloadSize uint32) {
	h := e.header
	return binary.NativeEndian.Uint32(h[headerInOut:]), int32(binary.NativeEndian.Uint32(h[headerInOut+4:])),
		binary.NativeEndian.Uint64(h[headerInOut+8:]), binary.NativeEndian.Uint32(h[entPayloadSize:])
}

func TestAnswerHandsTheRequestOverAndTheAnswerBack(t *testing.T) {
	e := testEntry()
	op := bytes.Repeat([]byte{0xab}, 24)
	request(e, 77, op, []byte("name\x00"))
	var seen [][]byte
	commitID := e.answer(func(in, out [][]byte) (int, syscall.Errno) {
		for _, b := range in {
			seen = append(seen, append([]byte(nil), b...))
		}
		// The answer: an out header and eight bytes after it.
		binary.NativeEndian.PutUint32(out[0], outHeaderSize+8)
		binary.NativeEndian.PutUint32(out[0][4:], 0)
		binary.NativeEndian.PutUint64(out[0][8:], 77)
		copy(out[1], "answer!!")
		return outHeaderSize + 8, 0
	})
	if commitID != 77 {
		t.Errorf("commit id %d, want 77", commitID)
	}
	if len(seen) != 3 || len(seen[0]) != inHeaderSize || !bytes.Equal(seen[1], op) || string(seen[2]) != "name\x00" {
		t.Fatalf("the handler got %q, want the in header, the operation's header and the name", seen)
	}
	length, errno, unique, payloadSize := outHeader(e)
	if length != outHeaderSize+8 || errno != 0 || unique != 77 || payloadSize != 8 || string(e.payload[:8]) != "answer!!" {
		t.Errorf("answer: length %d errno %d unique %d payload %d %q", length, errno, unique, payloadSize, e.payload[:8])
	}
}

func TestAnswerRefusesAMalformedRequest(t *testing.T) {
	for name, fill := range map[string]func(e *entry){
		"length shorter than the payload": func(e *entry) {
			request(e, 9, nil, []byte("abc"))
			binary.NativeEndian.PutUint32(e.header[headerInOut:], inHeaderSize)
		},
		"operation header too long": func(e *entry) {
			request(e, 9, nil, nil)
			binary.NativeEndian.PutUint32(e.header[headerInOut:], inHeaderSize+headerOpInSize+1)
		},
		"payload larger than the buffer": func(e *entry) {
			request(e, 9, nil, nil)
			binary.NativeEndian.PutUint32(e.header[entPayloadSize:], uint32(len(e.payload)+1))
			binary.NativeEndian.PutUint32(e.header[headerInOut:], uint32(inHeaderSize+len(e.payload)+1))
		},
	} {
		e := testEntry()
		fill(e)
		called := false
		e.answer(func(in, out [][]byte) (int, syscall.Errno) { called = true; return 0, 0 })
		length, errno, unique, payloadSize := outHeader(e)
		if called || length != outHeaderSize || errno != -int32(syscall.EIO) || unique != 9 || payloadSize != 0 {
			t.Errorf("%s: handler called %v; answer length %d errno %d unique %d payload %d, want EIO for request 9", name, called, length, errno, unique, payloadSize)
		}
	}
}

func TestAnswerWithoutAReplyStillGivesTheEntryBack(t *testing.T) {
	e := testEntry()
	request(e, 5, make([]byte, 8), nil)
	e.answer(func(in, out [][]byte) (int, syscall.Errno) { return 0, 0 }) // go-fuse's dropped reply
	if length, errno, unique, _ := outHeader(e); length != outHeaderSize || errno != -int32(syscall.EIO) || unique != 5 {
		t.Errorf("answer length %d errno %d unique %d, want EIO for request 5", length, errno, unique)
	}
	request(e, 6, make([]byte, 8), nil)
	e.answer(func(in, out [][]byte) (int, syscall.Errno) { return 0, syscall.ENOSPC })
	if _, errno, unique, _ := outHeader(e); errno != -int32(syscall.ENOSPC) || unique != 6 {
		t.Errorf("errno %d unique %d, want ENOSPC for request 6", errno, unique)
	}
}

// FuzzAnswer: whatever the kernel's buffers hold, answer neither panics
// nor hands the handler slices outside them.
func FuzzAnswer(f *testing.F) {
	f.Add(uint32(inHeaderSize+5), uint32(5), uint64(1))
	f.Add(uint32(0), uint32(0), uint64(0))
	f.Add(uint32(1<<31), uint32(1<<31), uint64(1<<63))
	f.Fuzz(func(t *testing.T, length, payloadSize uint32, unique uint64) {
		e := testEntry()
		binary.NativeEndian.PutUint32(e.header[headerInOut:], length)
		binary.NativeEndian.PutUint64(e.header[headerInOut+8:], unique)
		binary.NativeEndian.PutUint32(e.header[entPayloadSize:], payloadSize)
		e.answer(func(in, out [][]byte) (int, syscall.Errno) {
			total := 0
			for _, b := range in {
				total += len(b)
			}
			if total != int(length) {
				t.Fatalf("handler got %d bytes for a request of %d", total, length)
			}
			return 0, syscall.ENOENT
		})
		if _, errno, got, _ := outHeader(e); got != unique || errno >= 0 {
			t.Fatalf("answer for %d: unique %d errno %d", unique, got, errno)
		}
	})
}

package journal

import (
	"bytes"
	"testing"
)

// FuzzDecode checks that Decode never panics, that every error is one of the
// three documented kinds, and that a frame it accepts re-encodes to exactly
// the bytes it was decoded from. The seed corpus is in testdata/fuzz/FuzzDecode
// and is all that runs under a plain "go test".
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, n, err := Decode(data)
		if err != nil {
			if !isFrameError(err) {
				t.Fatalf("Decode returned an undocumented error: %v", err)
			}
			if n != 0 {
				t.Fatalf("Decode returned length %d with error %v", n, err)
			}
			return
		}
		if n < frameHeaderLen || n > len(data) {
			t.Fatalf("Decode returned length %d for a %d-byte input", n, len(data))
		}
		if rec.Seq == 0 {
			t.Fatalf("Decode accepted sequence number 0")
		}
		if again := encodeFrame(rec.Seq, rec.Payload); !bytes.Equal(again, data[:n]) {
			t.Fatalf("re-encoding differs:\n got  %x\n want %x", again, data[:n])
		}
	})
}

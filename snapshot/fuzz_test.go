package snapshot

import (
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"stagefs/internal/contenthash"
)

// FuzzDecodeManifest checks that DecodeManifest never panics and that what
// it accepts is consistent: every path's pre-image once (a directory move
// may repeat a path), in the order of the entries,
// valid ids, and a manifest written back from the result decodes to the
// same thing. The seed corpus is in testdata/fuzz/FuzzDecodeManifest and is
// all that runs under a plain "go test".
func FuzzDecodeManifest(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		info, entries, err := DecodeManifest(data)
		if err != nil {
			return
		}
		if ValidID(info.ID) != nil || ValidScope(info.ScopeID) != nil {
			t.Fatalf("accepted bad ids %q / %q", info.ID, info.ScopeID)
		}
		if len(info.Paths) != len(entries) {
			t.Fatalf("%d paths for %d entries", len(info.Paths), len(entries))
		}
		seen := map[string]bool{}
		bodies := map[contenthash.Hash]int64{}
		var sum int64
		for i, e := range entries {
			if checkEntry(&e) != nil {
				t.Fatalf("accepted bad entry %+v", e)
			}
			// One pre-image per path; directory moves are recorded
			// each time (restore undoes them in reverse order).
			if info.Paths[i] != e.Path || seen[entryKey(e)] {
				t.Fatalf("path %d: %q (paths %q)", i, e.Path, info.Paths)
			}
			seen[entryKey(e)] = true
			if _, ok := bodies[e.Hash]; e.Kind == KindFile && !ok {
				bodies[e.Hash] = e.Size
				sum += e.Size
			}
		}
		for _, p := range info.Uncaptured {
			if p == "" || validPath(p) != nil {
				t.Fatalf("accepted bad uncaptured path %q", p)
			}
		}
		if sum != info.Bytes {
			t.Fatalf("bytes %d, want %d", info.Bytes, sum)
		}

		again := encodeForTest(t, info, entries)
		info2, entries2, err := DecodeManifest(again)
		if err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v\n%s", err, again)
		}
		if !reflect.DeepEqual(info, info2) || !reflect.DeepEqual(entries, entries2) {
			t.Fatalf("round trip differs:\n%+v %+v\n%+v %+v", info, entries, info2, entries2)
		}
	})
}

// encodeForTest writes a manifest the way Create, Add and CloseSnapshot do.
func encodeForTest(t *testing.T, info Info, entries []Entry) []byte {
	b, err := marshalLine(header{ID: info.ID, ScopeID: info.ScopeID, Turn: info.Turn, Pid: info.Pid, Created: info.Created, Workspace: info.Workspace})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		l, err := marshalLine(e)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, l...)
	}
	for _, p := range info.Uncaptured {
		l, err := marshalLine(struct {
			Uncaptured string `json:"uncaptured"`
		}{p})
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, l...)
	}
	if info.Closed {
		b = append(b, closeMarker...)
	}
	return b
}

// TestFuzzSeeds makes sure the seeds exercise what their names say, so the
// corpus keeps covering an accepted manifest, a torn tail and a bad line.
func TestFuzzSeeds(t *testing.T) {
	for name, want := range map[string]int{"closed": 5, "torn-tail": 2, "bad-middle-line": -1} {
		raw, err := os.ReadFile("testdata/fuzz/FuzzDecodeManifest/" + name)
		if err != nil {
			t.Fatal(err)
		}
		lit, ok := strings.CutPrefix(string(raw), "go test fuzz v1\n[]byte(")
		lit, ok2 := strings.CutSuffix(lit, ")\n")
		if !ok || !ok2 {
			t.Fatalf("%s: not in the corpus format", name)
		}
		data, err := strconv.Unquote(lit)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		info, entries, err := DecodeManifest([]byte(data))
		switch {
		case want < 0 && err == nil:
			t.Errorf("%s: decoded, want an error", name)
		case want >= 0 && err != nil:
			t.Errorf("%s: %v", name, err)
		case want >= 0 && len(entries) != want:
			t.Errorf("%s: %d entries, want %d", name, len(entries), want)
		case name == "closed" && !info.Closed:
			t.Errorf("%s: not closed", name)
		}
	}
}

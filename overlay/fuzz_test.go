package overlay_test

import (
	"strings"
	"testing"

	"stagefs/overlay"
)

// FuzzCleanPath checks that CleanPath never panics and that any path it
// accepts stays inside the workspace: no ".." component, no leading "/",
// no NUL, and it is already clean (no "." or empty components; cleaning it
// again changes nothing). The seed corpus is in testdata/fuzz/FuzzCleanPath
// and is all that runs under a plain "go test".
func FuzzCleanPath(f *testing.F) {
	f.Fuzz(func(t *testing.T, p string) {
		got, err := overlay.CleanPath(p)
		if err != nil {
			if got != "" {
				t.Fatalf("CleanPath(%q) returned %q with error %v", p, got, err)
			}
			return
		}
		if strings.HasPrefix(got, "/") {
			t.Fatalf("CleanPath(%q) = %q: absolute", p, got)
		}
		if strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("CleanPath(%q) = %q: contains NUL", p, got)
		}
		if got == "" {
			return
		}
		for _, c := range strings.Split(got, "/") {
			switch c {
			case "..":
				t.Fatalf("CleanPath(%q) = %q: has a .. component", p, got)
			case ".", "":
				t.Fatalf("CleanPath(%q) = %q: not clean", p, got)
			}
		}
		again, err := overlay.CleanPath(got)
		if err != nil || again != got {
			t.Fatalf("CleanPath(%q) = %q, but CleanPath(%q) = %q, %v", p, got, got, again, err)
		}
	})
}

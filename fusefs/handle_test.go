package fusefs

import (
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
)

// go-fuse makes an open passthrough whenever its node has a backing file
// registered and the handle has PassthroughFd, whatever it answers: a
// handle served by the daemon must not have the method.
func TestOnlyPassthroughHandlesOfferABackingFile(t *testing.T) {
	var cached fs.FileHandle = &handle{}
	if _, ok := cached.(fs.FilePassthroughFder); ok {
		t.Error("a cached handle implements FilePassthroughFder")
	}
	var direct fs.FileHandle = &passthroughHandle{&handle{}}
	if _, ok := direct.(fs.FilePassthroughFder); !ok {
		t.Error("a passthrough handle does not implement FilePassthroughFder")
	}
	if h, ok := asHandle(direct); !ok || h == nil {
		t.Error("asHandle does not unwrap a passthrough handle")
	}
}

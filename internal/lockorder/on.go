//go:build lockorder

package lockorder

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

// Enabled says whether this build checks the order.
const Enabled = true

var (
	mu   sync.Mutex
	held = map[uint64][]Level{} // goroutine id -> levels held, in taking order
)

// Acquire panics when the calling goroutine holds a lock at level l or
// above: taking it now could deadlock against a goroutine that follows
// the order.
func Acquire(l Level) {
	g := goroutine()
	mu.Lock()
	for _, h := range held[g] {
		if h >= l {
			mu.Unlock()
			panic(fmt.Sprintf("lock order: %v taken while holding %v (goroutine %d holds %v)", l, h, g, held[g]))
		}
	}
	held[g] = append(held[g], l)
	mu.Unlock()
}

// Release forgets the last lock of level l the calling goroutine took.
func Release(l Level) {
	g := goroutine()
	mu.Lock()
	defer mu.Unlock()
	h := held[g]
	for i := len(h) - 1; i >= 0; i-- {
		if h[i] == l {
			h = append(h[:i], h[i+1:]...)
			break
		}
	}
	if len(h) == 0 {
		delete(held, g)
	} else {
		held[g] = h
	}
}

// goroutine returns the calling goroutine's id, from the first line of
// its stack ("goroutine 42 [running]:"): slow, which is why only this
// build does it.
func goroutine() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}

//go:build !lockorder

package lockorder

// Enabled says whether this build checks the order.
const Enabled = false

// Acquire notes that the calling goroutine is about to take a lock of
// level l (checked only with -tags lockorder).
func Acquire(l Level) {}

// Release notes that the calling goroutine let go of a lock of level l.
func Release(l Level) {}

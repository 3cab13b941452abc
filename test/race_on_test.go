//go:build race

package test

// raceEnabled: the tests run under the race detector, so the daemon of
// the concurrency stress test is built with it too.
const raceEnabled = true

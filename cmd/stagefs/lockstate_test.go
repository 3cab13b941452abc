package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// holdLock takes the state dir's lock as another daemon would, with pid
// in the pid file, and returns the release.
func holdLock(t *testing.T, state string, pid int) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(state, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(state, "pid"), []byte(strconv.Itoa(pid)), 0o600)
	return func() { f.Close() }
}

// A daemon killed a moment ago may still hold the lock while the kernel
// releases its files: the next one waits for it.
func TestLockStateWaitsForADeadDaemonsLock(t *testing.T) {
	state := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	release := holdLock(t, state, dead.Process.Pid)
	go func() {
		time.Sleep(200 * time.Millisecond)
		release()
	}()
	start := time.Now()
	f, err := lockState(state)
	if err != nil {
		t.Fatalf("lockState with the lock of a dead daemon: %v", err)
	}
	f.Close()
	if waited := time.Since(start); waited < 150*time.Millisecond {
		t.Errorf("lockState returned after %v, before the lock was released", waited)
	}
}

// A live daemon's lock is refused at once.
func TestLockStateRefusesALiveDaemon(t *testing.T) {
	state := t.TempDir()
	release := holdLock(t, state, os.Getpid())
	defer release()
	start := time.Now()
	if f, err := lockState(state); err == nil {
		f.Close()
		t.Fatal("lockState took the lock of a live daemon")
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("refusing a live daemon's lock took %v", waited)
	}
}

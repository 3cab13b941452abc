package main

import (
	"os"
	"testing"

	"github.com/spf13/pflag"
)

func TestShortAge(t *testing.T) {
	tests := []struct {
		ms   int64
		want string
	}{
		{-5, "0s"}, // clock skew must not print a negative age
		{0, "0s"},
		{999, "0s"},
		{3_000, "3s"},
		{59_999, "59s"},
		{60_000, "1m"},
		{125_000, "2m"},
		{3_599_999, "59m"},
		{3_600_000, "1h"},
		{86_399_999, "23h"},
		{86_400_000, "1d"},
		{10 * 86_400_000, "10d"},
	}
	for _, tt := range tests {
		if got := shortAge(tt.ms); got != tt.want {
			t.Errorf("shortAge(%d) = %q, want %q", tt.ms, got, tt.want)
		}
	}
}

func TestColorFlag(t *testing.T) {
	for _, v := range []string{"auto", "always", "never"} {
		c := colorFlag("auto")
		fs := pflag.NewFlagSet("diff", pflag.ContinueOnError)
		fs.Var(&c, "color", "")
		if err := fs.Parse([]string{"--color", v}); err != nil || string(c) != v {
			t.Errorf("--color %s: %q, %v", v, c, err)
		}
	}
	for _, v := range []string{"", "yes", "ALWAYS", "1"} {
		c := colorFlag("auto")
		fs := pflag.NewFlagSet("diff", pflag.ContinueOnError)
		fs.SetOutput(nopWriter{})
		fs.Var(&c, "color", "")
		if err := fs.Parse([]string{"--color=" + v}); err == nil {
			t.Errorf("--color=%q accepted", v)
		}
	}
}

type nopWriter struct{}

func (nopWriter) Write(b []byte) (int, error) { return len(b), nil }

func TestIsTerminal(t *testing.T) {
	// /dev/null is a character device but not a terminal.
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if isTerminal(null) {
		t.Errorf("isTerminal(%s) = true", os.DevNull)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isTerminal(w) {
		t.Error("isTerminal(pipe) = true")
	}
	// The master side of a pseudo-terminal is a terminal.
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to check the positive case: %v", err)
	}
	defer ptmx.Close()
	if !isTerminal(ptmx) {
		t.Error("isTerminal(/dev/ptmx) = false")
	}
}

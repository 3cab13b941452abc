package main

// /proc/self/mountinfo: which stagefs mounts there are and, from a mount's
// source, where its state dir (and so its control socket) is.

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	point, fstype, source string
}

func readMounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+3 {
			continue
		}
		out = append(out, mountEntry{point: unescapeMount(fields[4]), fstype: fields[sep+1], source: unescapeMount(fields[sep+2])})
	}
	return out, sc.Err()
}

// unescapeMount decodes the octal escapes (\040 for space) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// stagefsSourcePrefix marks stagefs mounts in /proc/mounts; the rest of the
// source is the state dir, so clients find the socket from a mount point.
const stagefsSourcePrefix = "stagefs:"

func isMounted(point string) (mountEntry, bool) {
	ms, _ := readMounts()
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].point == point {
			return ms[i], true
		}
	}
	return mountEntry{}, false
}

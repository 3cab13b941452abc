package overlay

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// procCache remembers, briefly, what /proc says of a process or thread:
// its thread group (process), parent and command name. One read of
// /proc/PID/status per process, not per operation; a pid reused within the
// TTL may show the old answers.
type procCache struct {
	mu sync.Mutex
	m  map[int]procInfo
}

type procInfo struct {
	tgid, ppid int
	comm       string
	at         time.Time
}

const procTTL = 2 * time.Second

func (c *procCache) get(pid int) procInfo {
	now := time.Now()
	c.mu.Lock()
	if e, ok := c.m[pid]; ok && now.Sub(e.at) < procTTL {
		c.mu.Unlock()
		return e
	}
	c.mu.Unlock()
	info := readProcStatus(pid)
	info.at = now
	c.mu.Lock()
	if c.m == nil || len(c.m) > 8192 {
		c.m = map[int]procInfo{}
	}
	c.m[pid] = info
	c.mu.Unlock()
	return info
}

func (c *procCache) comm(pid int) string { return c.get(pid).comm }

// process maps a thread id to its process id (itself when unknown).
func (c *procCache) process(tid int) int {
	if tid <= 0 {
		return tid
	}
	if t := c.get(tid).tgid; t > 0 {
		return t
	}
	return tid
}

// descends reports whether pid (a process or one of its threads) is
// ancestor or one of its descendants.
func (c *procCache) descends(pid, ancestor int) bool {
	for i := 0; i < 256 && pid > 1; i++ {
		if pid == ancestor {
			return true
		}
		info := c.get(pid)
		if info.tgid > 0 && info.tgid != pid {
			pid = info.tgid // a thread: its process is next
			continue
		}
		pid = info.ppid
	}
	return pid == ancestor
}

// readProcStatus parses Name, Tgid and PPid from /proc/PID/status (zero
// values when the process is gone). They are among its first lines, so
// one read(2) of its head does: every new process's first request pays
// for this (open, read, close rather than os.ReadFile's eleven calls).
func readProcStatus(pid int) procInfo {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/status", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return procInfo{}
	}
	var buf [1024]byte
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if err != nil || n <= 0 {
		return procInfo{}
	}
	var info procInfo
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Name":
			info.comm = v
		case "Tgid":
			info.tgid, _ = strconv.Atoi(v)
		case "PPid":
			info.ppid, _ = strconv.Atoi(v)
			return info // the fields come in this order
		}
	}
	return info
}

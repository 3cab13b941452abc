package fuseuring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The FUSE side (include/uapi/linux/fuse.h, fs/fuse/dev_uring.c).
const (
	cmdRegister       = 1 // FUSE_IO_URING_CMD_REGISTER
	cmdCommitAndFetch = 2 // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

	// struct fuse_uring_req_header: the in or out header, the operation's
	// own header (in only), then struct fuse_uring_ent_in_out.
	headerInOut     = 0
	headerOpIn      = 128
	headerOpInSize  = 128
	headerEntInOut  = 256
	headerSize      = 288
	entCommitID     = headerEntInOut + 8
	entPayloadSize  = headerEntInOut + 16
	inHeaderSize    = 40 // struct fuse_in_header
	outHeaderSize   = 16 // struct fuse_out_header
	iovecsAt        = 512
	cmdReqCommitID  = sqeOffsetCmd + 8 // struct fuse_uring_cmd_req in the submission
	cmdReqQueue     = sqeOffsetCmd + 16
	minPayload      = 8192 // FUSE_MIN_READ_BUFFER
	enableParameter = "/sys/module/fuse/parameters/enable_uring"
)

// Handler answers one FUSE request: in holds the request's bytes (the in
// header, the operation's header, the rest), out the space for the answer
// (the out header, then everything after it). It returns the number of
// bytes written to out, or an errno if it could not answer at all.
// go-fuse's ProtocolServer.HandleRequest has this shape.
//
// The answer goes into the buffers the request came in: a handler must
// have read what it needs of in before it writes a byte of out past the
// out header. go-fuse does (it reads a request whole before it answers,
// and copies names out before it fills a value in place).
type Handler func(in, out [][]byte) (n int, errno syscall.Errno)

// Options size a Transport.
type Options struct {
	// PerQueue is the number of entries, each with its thread, on the
	// queue of each online CPU: how many requests from one CPU can be
	// answered at once. 0: 4 (2 from 16 CPUs on). A CPU that is possible
	// but offline gets one entry: the kernel needs one on every queue.
	PerQueue int
	// MaxWrite is the mount's max_write; the payload buffers are sized
	// from it as the kernel sizes its own.
	MaxWrite int
	// Logf reports an entry that stopped for a reason other than the
	// end of the mount.
	Logf func(format string, args ...any)
}

// Transport is the set of ring entries serving one FUSE connection.
type Transport struct {
	entries  []*entry
	logf     func(format string, args ...any)
	wg       sync.WaitGroup
	fd       int // the connection's /dev/fuse descriptor, our own dup of it
	fallback sync.Once
}

// start is what an entry's thread is told once the mount exists: serve
// fd with handler, or (fd < 0) give up.
type start struct {
	fd      int
	handler Handler
	// registered gets nil once the kernel has taken the entry's
	// registration, or why it did not.
	registered chan<- error
}

type entry struct {
	t       *Transport
	queue   uint16
	ring    *ring
	mem     []byte // header, iovecs, payload
	header  []byte
	payload []byte
	start   chan start
	served  atomic.Uint64 // one counter per entry: no line shared across CPUs
	in      [3][]byte     // the request's pieces, kept to spare an allocation each
	out     [2][]byte
}

// Enabled reports whether the kernel offers FUSE over io_uring to new
// mounts now.
func Enabled() bool {
	b, err := os.ReadFile(enableParameter)
	return err == nil && strings.TrimSpace(string(b)) == "Y"
}

// Enable turns the kernel's offer on (root only) and says whether it was
// off. It stays on: it only lets a daemon ask for io_uring in FUSE_INIT,
// and turning it off again after our INIT would race with the next
// mount's (a branch's, another daemon's), which would then quietly get
// /dev/fuse.
func Enable() (turnedOn bool, err error) {
	if Enabled() {
		return false, nil
	}
	if err := os.WriteFile(enableParameter, []byte("1"), 0); err != nil {
		return false, fmt.Errorf("turning on FUSE over io_uring (%s): %w", enableParameter, err)
	}
	return true, nil
}

// cpuList reads a kernel CPU list file and returns the CPUs in it.
func cpuList(path string) (map[int]bool, error) {
	list, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseCPUs(strings.TrimSpace(string(list)))
}

// parseCPUs reads a kernel CPU list such as "0-3,8".
func parseCPUs(list string) (map[int]bool, error) {
	cpus := map[int]bool{}
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err1 := strconv.Atoi(lo)
		last, err2 := first, error(nil)
		if isRange {
			last, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || first < 0 || last < first || last-first >= 1<<16 {
			return nil, fmt.Errorf("unreadable CPU list %q", list)
		}
		for c := first; c <= last; c++ {
			cpus[c] = true
		}
	}
	return cpus, nil
}

// Prepare makes every entry's thread, ring and buffers, before the mount:
// once FUSE_INIT has negotiated io_uring, the kernel holds every request
// until each queue has an entry, so as little as possible may fail after
// it (and what does, Start turns into a fall back to /dev/fuse).
func Prepare(opts Options) (*Transport, error) {
	// The kernel makes one queue per possible CPU (num_possible_cpus),
	// numbered by CPU.
	possible, err := cpuList("/sys/devices/system/cpu/possible")
	if err != nil {
		return nil, fmt.Errorf("counting the kernel's FUSE queues: %w", err)
	}
	online, err := cpuList("/sys/devices/system/cpu/online")
	if err != nil {
		online = possible
	}
	if opts.PerQueue < 1 {
		opts.PerQueue = 4
		if len(online) >= 16 {
			opts.PerQueue = 2
		}
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	page := os.Getpagesize()
	// The kernel's max_payload_sz: max(FUSE_MIN_READ_BUFFER, max_write,
	// max_pages * page size), max_pages being max_write rounded up to
	// pages. A page more leaves room for an answer's own header before
	// a full payload.
	payload := max(minPayload, (opts.MaxWrite+page-1)/page*page) + page
	t := &Transport{logf: opts.Logf, fd: -1}
	ready := make(chan error)
	for q := 0; q < len(possible); q++ {
		n := 1
		if online[q] {
			n = opts.PerQueue
		}
		for i := 0; i < n; i++ {
			e := &entry{t: t, queue: uint16(q), start: make(chan start, 1)}
			t.entries = append(t.entries, e)
			t.wg.Add(1)
			go e.run(page, payload, ready)
		}
	}
	var errs []error
	for range t.entries {
		if err := <-ready; err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		t.Abandon()
		return nil, errs[0]
	}
	return t, nil
}

// Start registers every entry with the FUSE connection on fd and serves
// its requests with h until the connection ends. It returns once the
// kernel has taken every registration, or why one was refused: then the
// connection falls back to /dev/fuse, for good, and the entries that were
// taken stay idle.
func (t *Transport) Start(fd int, h Handler) error {
	// Our own descriptor: go-fuse closes fd when the connection ends,
	// while an entry may still be answering, and a number reused by then
	// would send its commit to another file.
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.fallBack(fd)
		t.Abandon()
		return fmt.Errorf("duplicating the /dev/fuse descriptor: %w", err)
	}
	t.fd = own
	registered := make(chan error, len(t.entries))
	for _, e := range t.entries {
		e.start <- start{fd: own, handler: h, registered: registered}
	}
	var first error
	for range t.entries {
		if err := <-registered; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		t.fallBack(own)
	}
	go func() {
		t.wg.Wait()
		unix.Close(own)
	}()
	return first
}

// fallBack makes the kernel give up io_uring for the connection on fd and
// wake the requests it holds for it, which then go over /dev/fuse. The
// kernel does that when a registration fails inside FUSE itself, so one
// is made to fail: for a queue that does not exist. Needed when an entry
// could not even be submitted, or its thread stopped before it was; a
// queue left without an entry would hold every request of the mount
// forever, its unmount included.
func (t *Transport) fallBack(fd int) {
	t.fallback.Do(func() {
		done := make(chan error)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r, err := newRing()
			if err != nil {
				done <- err
				return
			}
			defer r.close()
			sqe := r.prepare()
			uringCmd(sqe, fd, cmdRegister)
			binary.NativeEndian.PutUint16(sqe[cmdReqQueue:], 0xffff)
			r.push()
			_, err = r.wait()
			done <- err
		}()
		if err := <-done; err != nil {
			t.logf("fuse io_uring: could not make the kernel fall back to /dev/fuse: %v", err)
		}
	})
}

// Abandon releases the entries without registering them: the kernel did
// not offer io_uring after all.
func (t *Transport) Abandon() {
	for _, e := range t.entries {
		e.start <- start{fd: -1}
	}
	t.wg.Wait()
}

// Wait returns once every entry has stopped: the connection ended.
func (t *Transport) Wait() { t.wg.Wait() }

// Served is the number of requests answered through the rings so far.
func (t *Transport) Served() uint64 {
	var n uint64
	for _, e := range t.entries {
		n += e.served.Load()
	}
	return n
}

// Entries is the number of ring entries, all queues together.
func (t *Transport) Entries() int { return len(t.entries) }

// run is an entry's thread: it makes the entry's ring and buffers, then
// waits for Start and serves.
func (e *entry) run(page, payload int, ready chan<- error) {
	defer e.t.wg.Done()
	// The ring is single-issuer: this thread made it and is the only one
	// that may submit to it. The goroutine ends locked, so the thread
	// ends with it.
	runtime.LockOSThread()
	// The kernel hands a request to the queue of the CPU its caller runs
	// on; served from that CPU, it needs no wake-up of another core. Only
	// a preference: a CPU that is offline leaves the thread unpinned.
	var cpus unix.CPUSet
	cpus.Set(int(e.queue))
	unix.SchedSetaffinity(0, &cpus)
	err := e.setUp(page, payload)
	ready <- err
	if err != nil {
		return
	}
	defer e.tearDown()
	s := <-e.start
	if s.fd < 0 {
		return
	}
	if err := e.serve(s); err != nil {
		e.t.logf("fuse io_uring queue %d: %v", e.queue, err)
	}
}

func (e *entry) setUp(page, payload int) error {
	r, err := newRing()
	if err != nil {
		return err
	}
	// Off the Go heap: the kernel writes requests into these pages
	// whenever it likes, and they never move.
	mem, err := syscall.Mmap(-1, 0, page+payload, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_POPULATE)
	if err != nil {
		r.close()
		return fmt.Errorf("buffers for a FUSE ring entry: %w", err)
	}
	e.ring, e.mem = r, mem
	e.header, e.payload = mem[:headerSize], mem[page:]
	// The two iovecs a registration points at: header, payload.
	iov := unsafe.Slice((*syscall.Iovec)(unsafe.Pointer(&mem[iovecsAt])), 2)
	iov[0].Base, iov[0].Len = &e.header[0], uint64(len(e.header))
	iov[1].Base, iov[1].Len = &e.payload[0], uint64(len(e.payload))
	return nil
}

func (e *entry) tearDown() {
	e.ring.close()
	syscall.Munmap(e.mem)
}

// register submits the entry's registration and returns what the kernel
// said at once: a registration it refuses completes in the submission
// itself, one it takes completes only when a request comes.
func (e *entry) register(fd int) error {
	if beforeRegister != nil {
		if err := beforeRegister(e); err != nil {
			return err
		}
	}
	sqe := e.ring.prepare()
	uringCmd(sqe, fd, cmdRegister)
	binary.NativeEndian.PutUint64(sqe[sqeOffsetAddr:], uint64(uintptr(unsafe.Pointer(&e.mem[iovecsAt]))))
	binary.NativeEndian.PutUint32(sqe[sqeOffsetLen:], 2)
	binary.NativeEndian.PutUint16(sqe[cmdReqQueue:], e.queue)
	e.ring.push()
	if err := e.ring.enter(false); err != nil {
		return err
	}
	if res, ok := e.ring.peek(); ok && res < 0 {
		e.ring.completion()
		return fmt.Errorf("registering an entry of queue %d: %w", e.queue, syscall.Errno(-res))
	}
	return nil // (a request already there is served by serve's first wait)
}

// beforeRegister, set by tests, makes entries fail or change before they
// register.
var beforeRegister func(e *entry) error

// connectionGone reports whether errno says the FUSE connection ended
// (unmounted, aborted) or the ring is going away with the daemon.
func connectionGone(errno syscall.Errno) bool {
	return errno == syscall.ENOTCONN || errno == syscall.ECONNABORTED || errno == syscall.ECANCELED || errno == syscall.ENODEV
}

// serve registers the entry, then answers a request and fetches the next
// one in one submission, until the connection ends. A commit the kernel
// refuses for another reason registers the entry afresh, so its CPU's
// queue does not lose an entry for good.
func (e *entry) serve(s start) error {
	err := e.register(s.fd)
	s.registered <- err
	if err != nil {
		return err
	}
	for refused := 0; ; {
		res, err := e.ring.wait()
		if err != nil {
			return err
		}
		if res < 0 {
			errno := syscall.Errno(-res)
			if connectionGone(errno) {
				return nil
			}
			if refused++; refused > 3 {
				return fmt.Errorf("the kernel refused the entry %d times, the last: %w", refused, errno)
			}
			e.t.logf("fuse io_uring queue %d: %v; registering the entry again", e.queue, errno)
			if err := e.register(s.fd); err != nil {
				return err
			}
			continue
		}
		refused = 0
		commitID := e.answer(s.handler)
		e.served.Add(1)
		sqe := e.ring.prepare()
		uringCmd(sqe, s.fd, cmdCommitAndFetch)
		binary.NativeEndian.PutUint64(sqe[cmdReqCommitID:], commitID)
		binary.NativeEndian.PutUint16(sqe[cmdReqQueue:], e.queue)
		e.ring.push()
	}
}

// answer hands the request in the entry's buffers to h and leaves the
// answer in them; it returns the request's commit id.
func (e *entry) answer(h Handler) uint64 {
	hdr := e.header
	order := binary.NativeEndian
	commitID := order.Uint64(hdr[entCommitID:])
	unique := order.Uint64(hdr[headerInOut+8:])
	length := int(order.Uint32(hdr[headerInOut:]))
	payloadSize := int(order.Uint32(hdr[entPayloadSize:]))
	// The kernel does not say how long the operation's header is: it is
	// what the request's length leaves over.
	opSize := length - inHeaderSize - payloadSize
	n, errno := 0, syscall.EIO
	if opSize >= 0 && opSize <= headerOpInSize && payloadSize <= len(e.payload) {
		e.in = [3][]byte{hdr[headerInOut : headerInOut+inHeaderSize], hdr[headerOpIn : headerOpIn+opSize], e.payload[:payloadSize]}
		e.out = [2][]byte{hdr[headerInOut : headerInOut+outHeaderSize], e.payload}
		n, errno = h(e.in[:], e.out[:])
	}
	if errno != 0 || n < outHeaderSize {
		// No answer (a malformed request, or one go-fuse drops because
		// the connection is dying): the entry must still go back.
		if errno == 0 {
			errno = syscall.EIO
		}
		order.PutUint32(hdr[headerInOut:], outHeaderSize)
		order.PutUint32(hdr[headerInOut+4:], uint32(-int32(errno)))
		order.PutUint64(hdr[headerInOut+8:], unique)
		n = outHeaderSize
	}
	order.PutUint32(hdr[entPayloadSize:], uint32(n-outHeaderSize))
	return commitID
}

// ErrNotOffered says the kernel did not offer io_uring in FUSE_INIT.
var ErrNotOffered = errors.New("the kernel did not offer FUSE over io_uring (enable_uring is off, or Linux before 6.14)")

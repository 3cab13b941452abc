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
	"time"
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
	reserved int // a descriptor number Start makes the connection's own copy on
	// fallback is a thread with a ring of its own, made by Prepare, that
	// Start asks to make the kernel fall back to /dev/fuse (fd), or to
	// end (-1): nothing it needs can fail once asked.
	fallback chan int
	fellBack chan error
	// fallbackDone: the fallback thread has ended or is ending;
	// reservedTaken: Start has the reserved descriptor, or it is closed.
	fallbackDone, reservedTaken bool
}

// registration is an entry's answer to Start.
type registration struct {
	queue uint16
	err   error
}

// start is what an entry's thread is told once the mount exists: serve
// fd with handler, or (fd < 0) give up.
type start struct {
	fd      int
	handler Handler
	// registered gets the kernel's answer to the entry's registration.
	registered chan<- registration
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
	t := &Transport{logf: opts.Logf, fallback: make(chan int), fellBack: make(chan error)}
	// What Start may need is taken now, while failing is still harmless:
	// the descriptor number for its copy of the connection's (a dup
	// onto it cannot fail for want of descriptors) and the ring that
	// makes the kernel fall back.
	if t.reserved, err = unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("a descriptor for the FUSE rings: %w", err)
	}
	fallbackReady := make(chan error)
	go t.fallbackThread(fallbackReady)
	if err := <-fallbackReady; err != nil {
		unix.Close(t.reserved)
		return nil, err
	}
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
// its requests with h until the connection ends. It returns nil once the
// kernel has taken an entry on every queue, the rings serving (an entry
// it refused is logged); otherwise it makes the connection fall back to
// /dev/fuse, for good, and says why: the entries that were taken stay
// idle until the connection ends.
func (t *Transport) Start(fd int, h Handler) error {
	// Our own descriptor: go-fuse closes fd when the connection ends,
	// while an entry may still be answering, and a number reused by then
	// would send its commit to another file.
	own := t.reserved
	t.reservedTaken = true
	if err := unix.Dup3(fd, own, unix.O_CLOEXEC); err != nil {
		unix.Close(own)
		t.fallBack(fd)
		t.Abandon()
		return fmt.Errorf("copying the /dev/fuse descriptor: %w", err)
	}
	registered := make(chan registration, len(t.entries))
	taken := map[uint16]int{} // queue -> entries the kernel took
	for _, e := range t.entries {
		taken[e.queue] = 0
		e.start <- start{fd: own, handler: h, registered: registered}
	}
	var refused error
	for range t.entries {
		r := <-registered
		if r.err == nil {
			taken[r.queue]++
		} else if refused == nil {
			refused = r.err
		}
	}
	var err error
	for q, n := range taken {
		if n == 0 {
			// The kernel holds every request until each queue has
			// an entry: this one never will.
			err = fmt.Errorf("queue %d got no entry: %w", q, refused)
			t.fallBack(own)
			break
		}
	}
	if err == nil && refused != nil {
		t.logf("fuse io_uring: an entry was refused (%v); every queue has others", refused)
	}
	t.stopFallback()
	go func() {
		t.wg.Wait()
		unix.Close(own)
	}()
	return err
}

// fallbackThread is the thread fallBack works on, with its ring made
// before anything depends on it.
func (t *Transport) fallbackThread(ready chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := newRing()
	ready <- err
	if err != nil {
		return
	}
	defer r.close()
	fd := <-t.fallback
	if fd < 0 {
		return
	}
	// A registration for a queue that does not exist fails inside
	// FUSE, which is what makes the kernel give up io_uring for the
	// connection and wake the requests it holds for it.
	sqe := r.prepare()
	uringCmd(sqe, fd, cmdRegister)
	binary.NativeEndian.PutUint16(sqe[cmdReqQueue:], 0xffff)
	r.push()
	_, err = r.wait()
	t.fellBack <- err
}

// fallBack makes the kernel give up io_uring for the connection on fd and
// send the requests it holds, and all later ones, over /dev/fuse. Needed
// when a queue got no entry: the kernel would hold every request of the
// mount forever, its unmount included.
func (t *Transport) fallBack(fd int) {
	if t.fallbackDone {
		return
	}
	t.fallbackDone = true
	t.fallback <- fd
	if err := <-t.fellBack; err != nil {
		t.logf("fuse io_uring: could not make the kernel fall back to /dev/fuse: %v", err)
	}
}

// stopFallback ends the fallback thread unless fallBack used it.
func (t *Transport) stopFallback() {
	if !t.fallbackDone {
		t.fallbackDone = true
		t.fallback <- -1
	}
}

// Abandon releases the entries without registering them: the kernel did
// not offer io_uring after all.
func (t *Transport) Abandon() {
	for _, e := range t.entries {
		e.start <- start{fd: -1}
	}
	t.wg.Wait()
	t.stopFallback()
	if !t.reservedTaken {
		t.reservedTaken = true
		unix.Close(t.reserved)
	}
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
	e.submitRegister(fd)
	if err := e.ring.enter(false); err != nil {
		return err
	}
	if res, ok := e.ring.peek(); ok && res < 0 {
		e.ring.completion()
		return fmt.Errorf("registering an entry of queue %d: %w", e.queue, syscall.Errno(-res))
	}
	return nil // (a request already there is served by serve's first wait)
}

// submitRegister queues the entry's registration for the next enter.
func (e *entry) submitRegister(fd int) {
	sqe := e.ring.prepare()
	uringCmd(sqe, fd, cmdRegister)
	binary.NativeEndian.PutUint64(sqe[sqeOffsetAddr:], uint64(uintptr(unsafe.Pointer(&e.mem[iovecsAt]))))
	binary.NativeEndian.PutUint32(sqe[sqeOffsetLen:], 2)
	binary.NativeEndian.PutUint16(sqe[cmdReqQueue:], e.queue)
	e.ring.push()
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
// one in one submission, until the connection ends. Once the rings serve,
// there is no falling back: a commit or registration the kernel refuses
// for another reason registers the entry afresh (waiting longer each
// time), so that its CPU's queue does not lose an entry for good.
func (e *entry) serve(s start) error {
	err := e.register(s.fd)
	s.registered <- registration{queue: e.queue, err: err}
	if err != nil {
		return err
	}
	for refused := 0; ; {
		res, err := e.ring.wait()
		if err != nil {
			return fmt.Errorf("%w: the queue has an entry less until the mount ends", err)
		}
		if res < 0 {
			errno := syscall.Errno(-res)
			if connectionGone(errno) {
				return nil
			}
			refused++
			e.t.logf("fuse io_uring queue %d: the kernel refused the entry (%v, %d in a row); registering it again", e.queue, errno, refused)
			time.Sleep(min(time.Duration(refused)*10*time.Millisecond, time.Second))
			e.submitRegister(s.fd)
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

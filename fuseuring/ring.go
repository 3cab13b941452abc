package fuseuring

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The little of io_uring this package needs: one ring per thread, 128-byte
// submissions (the FUSE command lives in their tail), one submission in
// flight, completions read one at a time. Layouts and numbers are the
// kernel's (include/uapi/linux/io_uring.h).

const (
	setupSQE128        = 1 << 10
	setupSingleIssuer  = 1 << 12
	setupDeferTaskrun  = 1 << 13
	enterGetEvents     = 1 << 0
	featSingleMmap     = 1 << 0
	opURingCmd         = 46
	offSQRing          = 0
	offSQEs            = 0x10000000
	sqeSize            = 128
	cqeSize            = 16
	sqeOffsetCmdOp     = 8
	sqeOffsetAddr      = 16
	sqeOffsetLen       = 24
	sqeOffsetCmd       = 48 // the 80-byte command area of a 128-byte submission
	ringEntries        = 2  // one submission in flight; the smallest ring
	ringSetupFlags     = setupSQE128 | setupSingleIssuer | setupDeferTaskrun
	errRingUnsupported = "io_uring with 128-byte submissions, one issuer and deferred task work (Linux 6.1+)"
)

// ringParams is struct io_uring_params.
type ringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  ringOffsets
	cqOff                                                                  ringOffsets
}

// ringOffsets is struct io_sqring_offsets or io_cqring_offsets: the same
// shape, different names for some fields. For the submission ring: head,
// tail, ring_mask, ring_entries, flags, dropped, array; for the completion
// ring: head, tail, ring_mask, ring_entries, overflow, cqes, flags.
type ringOffsets struct {
	head, tail, ringMask, ringEntries, f4, f5, f6, resv1 uint32
	userAddr                                             uint64
}

// ring is one io_uring, used by the one thread that made it.
type ring struct {
	fd      int
	mem     []byte // submission and completion rings (one mapping)
	sqes    []byte
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqArray unsafe.Pointer
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    unsafe.Pointer
}

func newRing() (*ring, error) {
	var p ringParams
	p.flags = ringSetupFlags
	fd, _, errno := syscall.RawSyscall(unix.SYS_IO_URING_SETUP, ringEntries, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w (needs %s)", errno, errRingUnsupported)
	}
	r := &ring{fd: int(fd)}
	if p.features&featSingleMmap == 0 {
		r.close()
		return nil, fmt.Errorf("io_uring without a single ring mapping (Linux 5.4+)")
	}
	size := max(p.sqOff.f6+p.sqEntries*4, p.cqOff.f5+p.cqEntries*cqeSize)
	var err error
	if r.mem, err = syscall.Mmap(r.fd, offSQRing, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("mapping the io_uring: %w", err)
	}
	if r.sqes, err = syscall.Mmap(r.fd, offSQEs, int(p.sqEntries)*sqeSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("mapping the io_uring submissions: %w", err)
	}
	at := func(off uint32) unsafe.Pointer { return unsafe.Pointer(&r.mem[off]) }
	r.sqHead, r.sqTail = (*uint32)(at(p.sqOff.head)), (*uint32)(at(p.sqOff.tail))
	r.sqMask, r.sqArray = *(*uint32)(at(p.sqOff.ringMask)), at(p.sqOff.f6)
	r.cqHead, r.cqTail = (*uint32)(at(p.cqOff.head)), (*uint32)(at(p.cqOff.tail))
	r.cqMask, r.cqes = *(*uint32)(at(p.cqOff.ringMask)), at(p.cqOff.f5)
	return r, nil
}

// prepare returns the next submission slot, zeroed. Only one submission
// is ever waiting, so there is always room.
func (r *ring) prepare() []byte {
	tail := atomic.LoadUint32(r.sqTail)
	i := tail & r.sqMask
	sqe := r.sqes[i*sqeSize : (i+1)*sqeSize]
	clear(sqe)
	*(*uint32)(unsafe.Add(r.sqArray, 4*i)) = i
	return sqe
}

// push makes the prepared submission visible to the kernel.
func (r *ring) push() {
	atomic.AddUint32(r.sqTail, 1)
}

// uringCmd fills sqe as an IORING_OP_URING_CMD on fd. The kernel reads
// submissions in the machine's own byte order.
func uringCmd(sqe []byte, fd int, cmdOp uint32) {
	sqe[0] = opURingCmd
	binary.NativeEndian.PutUint32(sqe[4:], uint32(fd))
	binary.NativeEndian.PutUint32(sqe[sqeOffsetCmdOp:], cmdOp)
}

// peek returns the next completion's result, if one is there, and leaves
// it there.
func (r *ring) peek() (res int32, ok bool) {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return 0, false
	}
	return *(*int32)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*cqeSize+8)), true
}

// completion returns the next completion's result, if one is there.
func (r *ring) completion() (res int32, ok bool) {
	if res, ok = r.peek(); ok {
		atomic.AddUint32(r.cqHead, 1)
	}
	return res, ok
}

// enter submits what is pushed and, when wait is set, blocks until a
// completion is there. The thread's deferred task work (the kernel
// copying a request into the entry's buffers) runs inside this call.
func (r *ring) enter(wait bool) error {
	for {
		toSubmit := atomic.LoadUint32(r.sqTail) - atomic.LoadUint32(r.sqHead)
		minComplete, flags := uintptr(0), uintptr(0)
		if wait {
			minComplete, flags = 1, enterGetEvents
		}
		_, _, errno := syscall.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), minComplete, flags, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			// A signal (the Go runtime's preemption): what was taken
			// stays taken, the rest is submitted again.
		case syscall.EAGAIN, syscall.EBUSY:
			time.Sleep(time.Millisecond) // the kernel is short of memory: not a spin
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		if !wait && atomic.LoadUint32(r.sqTail) == atomic.LoadUint32(r.sqHead) {
			return nil
		}
	}
}

// wait submits what is pushed and returns the next completion's result,
// blocking until there is one.
func (r *ring) wait() (int32, error) {
	for {
		if res, ok := r.completion(); ok {
			return res, nil
		}
		if err := r.enter(true); err != nil {
			return 0, err
		}
	}
}

func (r *ring) close() {
	if r.sqes != nil {
		syscall.Munmap(r.sqes)
	}
	if r.mem != nil {
		syscall.Munmap(r.mem)
	}
	syscall.Close(r.fd)
}

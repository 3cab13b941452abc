package control

import (
	"net"
	"syscall"
)

// peerCred returns the process on the other end of c, as the kernel
// recorded it at connect time (SO_PEERCRED), so it cannot be faked. The pid
// is in the daemon's pid namespace.
func peerCred(c *net.UnixConn) (Peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *syscall.Ucred
	var credErr error
	err = raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err != nil {
		return Peer{}, err
	}
	if credErr != nil {
		return Peer{}, credErr
	}
	return Peer{Pid: int(cred.Pid), Uid: cred.Uid, Gid: cred.Gid}, nil
}

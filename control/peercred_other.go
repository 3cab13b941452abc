//go:build !linux

package control

import (
	"errors"
	"net"
)

// peerCred is only implemented on Linux. Elsewhere every peer is refused,
// since an unchecked control socket would let anyone commit files.
func peerCred(c *net.UnixConn) (Peer, error) {
	return Peer{}, errors.New("peer credentials are not supported on this system")
}

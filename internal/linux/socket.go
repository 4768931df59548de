package linux

import (
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// This file holds the socket calls of packages runc (the CRIU swrk pair,
// the shim gate's peer check), transfer (receive windows) and netplane
// (frames sent out of the overlay device).

// SeqpacketPair returns a connected pair of AF_UNIX SOCK_SEQPACKET
// sockets (close-on-exec), named nameA and nameB: how runc talks to
// `criu swrk`.
func SeqpacketPair(nameA, nameB string) (a, b *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), nameA), os.NewFile(uintptr(fds[1]), nameB), nil
}

// PeerCredentials returns the credentials (SO_PEERCRED) of the process
// at the other end of the unix socket behind rc, as of its connect.
func PeerCredentials(rc syscall.RawConn) (*unix.Ucred, error) {
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

// SetReadBufferForceFD sets socket fd's receive buffer to bytes with
// SO_RCVBUFFORCE (past net.core.rmem_max; needs CAP_NET_ADMIN). It is
// for a Control function, which has the descriptor already; the error is
// the bare errno.
func SetReadBufferForceFD(fd uintptr, bytes int) error {
	return unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes)
}

// SetReadBufferFD sets socket fd's receive buffer to bytes with
// SO_RCVBUF (the kernel caps it at net.core.rmem_max). The error is the
// bare errno.
func SetReadBufferFD(fd uintptr, bytes int) error {
	return unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, bytes)
}

// TCPInfo is the kernel's struct tcp_info.
type TCPInfo = unix.TCPInfo

// GetTCPInfo returns the kernel's TCP_INFO of the TCP socket behind rc.
func GetTCPInfo(rc syscall.RawConn) (*TCPInfo, error) {
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) { info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return nil, err
	}
	return info, serr
}

// EtherTypeIPv4 is the Ethernet type of an IPv4 packet (ETH_P_IP).
const EtherTypeIPv4 = unix.ETH_P_IP

// FrameSender sends raw Ethernet frames out of one link to one hardware
// address (an AF_PACKET socket; needs CAP_NET_RAW).
type FrameSender struct {
	fd int
	sa *unix.SockaddrLinklayer
}

// OpenFrameSender opens a packet socket sending frames of type etherType
// out of the link with index ifindex, to the hardware address to. The
// socket is of the calling thread's network namespace (see InNetNS).
func OpenFrameSender(ifindex int, etherType uint16, to net.HardwareAddr) (*FrameSender, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	sa := &unix.SockaddrLinklayer{Ifindex: ifindex, Protocol: etherType<<8 | etherType>>8, Halen: uint8(len(to))}
	copy(sa.Addr[:], to)
	return &FrameSender{fd: fd, sa: sa}, nil
}

// Send sends one whole frame (destination and source addresses, type,
// payload).
func (s *FrameSender) Send(frame []byte) error { return unix.Sendto(s.fd, frame, 0, s.sa) }

// Close closes the socket.
func (s *FrameSender) Close() error { return unix.Close(s.fd) }

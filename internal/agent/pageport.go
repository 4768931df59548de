package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// pagePorts hands out loopback ports for CRIU's page server.
//
// CRIU binds the port itself, after the service is frozen and without
// SO_REUSEADDR, so a port picked earlier must still be free then. A port
// from bind(0), closed again, is not: until CRIU binds it, the kernel may
// hand it to any other bind(0) or connect() in the namespace, and the
// migration fails with "Can't bind page server: Address already in use"
// (seen once in CI). So the ports come from just below the namespace's
// ephemeral range, which the kernel never hands out by itself, in
// rotation, so an earlier migration's port is not offered again soon, and
// each candidate is test-bound the way CRIU binds it, which also skips a
// port whose last connection is still in TIME_WAIT.
type pagePorts struct {
	mu   sync.Mutex
	next int // next candidate; 0 before the first pick
	// lo and hi bound the ports (inclusive); zero means below the
	// ephemeral range read from /proc.
	lo, hi int
}

// pagePortSpan is how many ports below the ephemeral range are used.
const pagePortSpan = 2048

// pick returns "127.0.0.1:port" for a port CRIU can bind now.
func (p *pagePorts) pick() (string, error) {
	lo, hi := p.lo, p.hi
	if lo == 0 || hi == 0 {
		eph, err := ephemeralLow()
		if err != nil {
			return "", err
		}
		hi = eph - 1
		lo = max(hi-pagePortSpan+1, 1024)
	}
	if hi < lo {
		return "", fmt.Errorf("no ports below the ephemeral range (starts at %d); lower net.ipv4.ip_local_port_range", hi+1)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var lastErr error
	for range hi - lo + 1 {
		if p.next < lo || p.next > hi {
			p.next = lo
		}
		port := p.next
		p.next++
		err := bindLoopback(port)
		if err == nil {
			return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return "", err
		}
		lastErr = err
	}
	return "", fmt.Errorf("no free loopback port in %d-%d: %w", lo, hi, lastErr)
}

// bindLoopback binds a socket to 127.0.0.1:port without SO_REUSEADDR, as
// CRIU's page server does, and closes it.
func bindLoopback(port int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_TCP)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fmt.Errorf("bind 127.0.0.1:%d: %w", port, err)
	}
	return nil
}

// ephemeralLow reads the first port of this network namespace's ephemeral
// range.
func ephemeralLow() (int, error) {
	const path = "/proc/sys/net/ipv4/ip_local_port_range"
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, fmt.Errorf("%s: unexpected %q", path, b)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

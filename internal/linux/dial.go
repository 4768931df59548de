package linux

import (
	"context"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// DialAbortive connects to a TCP address with SO_LINGER set to zero before
// the connect, so that from its first moment the connection ends with a
// reset, never with end of file, when it is closed or this process dies.
// A peer that reads end of file as "done" (CRIU's page server takes it
// for a finished lazy-dump session and kills the dumped tasks) then never
// mistakes a crash for a clean end, however early the crash comes; setting
// the option after the dial leaves a window where it would. A caller whose
// stream ended cleanly restores a graceful close with SetLinger(-1).
func DialAbortive(ctx context.Context, addr string) (*net.TCPConn, error) {
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("set SO_LINGER: %w", serr)
		}
		return nil
	}}
	d.SetMultipathTCP(false)
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

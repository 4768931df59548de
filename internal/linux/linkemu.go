package linux

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SetReadBufferForce sets the receive buffer of the socket behind rc to
// bytes with SO_RCVBUFFORCE, which (with CAP_NET_ADMIN) goes past
// net.core.rmem_max. linkemu uses it on its NFQUEUE netlink sockets so a
// burst of queued packets does not overrun them.
func SetReadBufferForce(rc syscall.RawConn, bytes int) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("set SO_RCVBUFFORCE %d: %w", bytes, err)
	}
	return nil
}

// SetTimerSlack sets the calling thread's timer slack (how late the kernel
// may fire its timers to batch wake-ups; 50 µs by default) to ns. The
// caller must have locked its goroutine to the thread.
func SetTimerSlack(ns int) error {
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ns), 0, 0, 0); err != nil {
		return fmt.Errorf("set timer slack: %w", err)
	}
	return nil
}

// Nanosleep blocks the calling thread for d with the kernel's
// high-resolution timers (Go's timers wake up to a millisecond late for
// short sleeps). Interrupted sleeps are resumed.
func Nanosleep(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	for ts.Sec > 0 || ts.Nsec > 0 {
		var rem unix.Timespec
		if err := unix.Nanosleep(&ts, &rem); err != unix.EINTR {
			return
		}
		ts = rem
	}
}

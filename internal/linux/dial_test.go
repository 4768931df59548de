package linux

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDialAbortive: the connection comes back with SO_LINGER already zero,
// so closing it resets the peer; after SetLinger(-1) it ends with end of
// file as usual.
func TestDialAbortive(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ends := make(chan error, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, err := io.Copy(io.Discard, c)
				ends <- err
			}()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := DialAbortive(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var lg *unix.Linger
	var gerr error
	if err := rc.Control(func(fd uintptr) { lg, gerr = unix.GetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if lg.Onoff != 1 || lg.Linger != 0 {
		t.Fatalf("SO_LINGER = %+v, want on with 0 s", *lg)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := waitEnd(t, ends); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the peer saw %v when the connection closed, want a reset", err)
	}

	c, err = DialAbortive(ctx, l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetLinger(-1); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := waitEnd(t, ends); err != nil {
		t.Fatalf("after SetLinger(-1) the peer saw %v, want end of file", err)
	}

	if _, err := DialAbortive(ctx, "127.0.0.1:1"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial of a closed port: %v, want connection refused", err)
	}
}

func waitEnd(t *testing.T, ends <-chan error) error {
	t.Helper()
	select {
	case err := <-ends:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the peer never saw the connection end")
		return nil
	}
}

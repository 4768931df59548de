package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// Serve answers the probe protocol on every connection accepted from ln,
// each connection in its own goroutine with plain blocking reads and writes
// (no deadlines or timers, so CRIU can checkpoint and restore it with its
// TCP connections). It returns nil once ctx is done, after closing ln and
// every open connection and waiting for their goroutines; it returns an
// error if accepting fails for another reason. Serve owns ln.
func Serve(ctx context.Context, ln net.Listener) error {
	s := &server{conns: map[net.Conn]struct{}{}}
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		s.closeAll()
	})
	defer stop()
	defer s.wg.Wait()
	defer ln.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors: wait for connections to close,
				// as net/http does.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		if !s.add(c) {
			c.Close()
			return nil
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.remove(c)
			serveConn(c)
		}()
	}
}

// server tracks open connections so that Serve can close them on shutdown.
type server struct {
	wg     sync.WaitGroup
	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool
}

func (s *server) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *server) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

func (s *server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
}

// serveConn answers one connection until the peer closes it or an I/O
// error occurs; replies for all lines completed by one read go out in one
// write.
func serveConn(c net.Conn) {
	var cnt Counter
	buf := make([]byte, 32<<10)
	var out []byte
	for {
		n, err := c.Read(buf)
		if n > 0 {
			out = cnt.Feed(out[:0], buf[:n])
			if len(out) > 0 {
				if _, werr := c.Write(out); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// Listen opens the server's TCP listener on addr (":7000" for every
// address). Since Go 1.24 listeners use MPTCP by default, and CRIU cannot
// checkpoint MPTCP sockets ("Unsupported proto 262"), so Listen asks for
// plain TCP.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, "tcp", addr)
}

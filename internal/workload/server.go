package workload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
)

// Listen opens DPRGen's listener: plain TCP, not Go's default MPTCP,
// which CRIU cannot checkpoint.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, "tcp", addr)
}

// Serve answers the line protocol (see protocol.go) on ln for g until ctx
// ends or ln is closed; it closes ln and every connection before it
// returns. Each connection is served by a goroutine Serve waits for.
func Serve(ctx context.Context, ln net.Listener, g *Generator) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // guards conns
		conns = map[net.Conn]struct{}{}
	)
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			serveConn(c, g)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			c.Close()
		}()
	}
}

// serveConn answers requests on one connection until it closes.
func serveConn(c net.Conn, g *Generator) {
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 1024), 1024)
	w := bufio.NewWriter(c)
	for sc.Scan() {
		if _, err := fmt.Fprintln(w, Answer(g, sc.Text())); err != nil {
			return
		}
		if err := w.Flush(); err != nil {
			return
		}
	}
}

// Answer returns the reply line to one request line.
func Answer(g *Generator, req string) string {
	switch strings.TrimSpace(req) {
	case "check":
		return CheckLine(g.Check())
	case "stats":
		return StatsLine(g.Stats())
	case "ping":
		return "pong"
	}
	return fmt.Sprintf("error unknown request %q (check, stats, ping)", req)
}

package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"
)

// silent opens a TCP connection to addr from the local address from
// ("" for any) and sends nothing: a host on the underlay that holds a
// handshake open.
func silent(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// acceptGood accepts until a connection arrives, skipping the handshake
// failures of silent clients, and sends it on the returned channel.
func acceptGood(t *testing.T, ctx context.Context, l *Listener) <-chan error {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		for {
			c, err := l.Accept(ctx)
			if errors.Is(err, ErrHandshake) {
				continue
			}
			if c != nil {
				c.Close()
			}
			ch <- err
			return
		}
	}()
	return ch
}

// refused fails unless a connection from from ("" for any) to addr is
// closed by the listener within d: it may already fail to connect (the
// reset came first) or read the reset.
func refused(t *testing.T, addr, from string, d time.Duration, what string) {
	t.Helper()
	dl := net.Dialer{}
	if from != "" {
		dl.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := dl.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err = c.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open after %v", what, d)
	}
	if err == nil {
		t.Fatalf("%s: read a byte", what)
	}
}

// stillOpen fails if the peer of c closed it (it waits d to see).
func stillOpen(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("%s: closed by the listener (%v)", what, err)
	}
}

// TestAcceptNotBlockedBySilentClient: a connection that never starts its
// handshake does not delay a real agent's: the agent is accepted well
// before the silent one's handshake times out.
func TestAcceptNotBlockedBySilentClient(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1", "edge2")
	const timeout = 5 * time.Second
	l, err := NetConfig{HandshakeTimeout: timeout}.Listen(context.Background(), "127.0.0.1:0", serverCfg(t, dirs["edge1"]))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	silent(t, l.Addr().String(), "")
	time.Sleep(50 * time.Millisecond) // the silent one is accepted first

	ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
	defer cancel()
	start := time.Now()
	acc := acceptGood(t, ctx, l)
	c, err := Dial(ctx, l.Addr().String(), clientCfg(t, dirs["edge2"], "edge1"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > timeout/2 {
		t.Fatalf("a silent connection delayed the agent's accept by %v (handshake timeout %v)", d, timeout)
	}
}

// TestHandshakeLimits: connections over the per-source limit, or over the
// global one, are closed at once while those within wait for their
// handshake; another source is not held up by a full one.
func TestHandshakeLimits(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1", "edge2")
	t.Run("per source", func(t *testing.T) {
		nc := NetConfig{HandshakeTimeout: 5 * time.Second, MaxHandshakesPerSource: 3}
		l, err := nc.Listen(context.Background(), "127.0.0.1:0", serverCfg(t, dirs["edge1"]))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var within []net.Conn
		for range nc.MaxHandshakesPerSource {
			within = append(within, silent(t, l.Addr().String(), "127.0.0.1"))
		}
		time.Sleep(100 * time.Millisecond) // all accepted
		start := time.Now()
		for range 3 {
			refused(t, l.Addr().String(), "127.0.0.1", time.Second, "connection over the per-source limit")
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("excess connections closed after %v", d)
		}
		for _, c := range within {
			stillOpen(t, c, 20*time.Millisecond, "connection within the limit")
		}
		// Another source (127.0.0.2 is loopback too) is served at once.
		if !loopbackAlias(t) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		acc := acceptGood(t, ctx, l)
		cfg := clientCfg(t, dirs["edge2"], "edge1")
		c, err := dialFrom(ctx, "127.0.0.2", l.Addr().String(), cfg)
		if err != nil {
			t.Fatalf("another source: %v", err)
		}
		c.Close()
		if err := <-acc; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("global", func(t *testing.T) {
		nc := NetConfig{HandshakeTimeout: 5 * time.Second, MaxHandshakes: 2, MaxHandshakesPerSource: 10}
		l, err := nc.Listen(context.Background(), "127.0.0.1:0", serverCfg(t, dirs["edge1"]))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		a := silent(t, l.Addr().String(), "")
		b := silent(t, l.Addr().String(), "")
		time.Sleep(100 * time.Millisecond)
		refused(t, l.Addr().String(), "", time.Second, "connection over the global limit")
		stillOpen(t, a, 20*time.Millisecond, "first connection")
		stillOpen(t, b, 20*time.Millisecond, "second connection")
		// A slot freed (the client gave up, its failure was delivered) is
		// taken by the next agent.
		a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := l.Accept(ctx); !errors.Is(err, ErrHandshake) {
			t.Fatalf("Accept after the silent client left: %v, want ErrHandshake", err)
		}
		for busy := true; busy; { // its goroutine ends just after the delivery
			l.mu.Lock()
			busy = l.handshakes >= nc.MaxHandshakes
			l.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
		acc := acceptGood(t, ctx, l)
		c, err := Dial(ctx, l.Addr().String(), clientCfg(t, dirs["edge2"], "edge1"))
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if err := <-acc; err != nil {
			t.Fatal(err)
		}
	})
}

// loopbackAlias reports whether this host can use 127.0.0.2 as a source.
func loopbackAlias(t *testing.T) bool {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Logf("no 127.0.0.2 here (%v): the other-source check skipped", err)
		return false
	}
	ln.Close()
	return true
}

// dialFrom is Dial from the local address from (tests: another source).
func dialFrom(ctx context.Context, from, addr string, cfg *tls.Config) (*Conn, error) {
	cfg, err := prepareTLS(cfg)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c, err := handshake(ctx, tls.Client(raw, cfg), false)
	if err != nil {
		raw.Close()
	}
	return c, err
}

// TestListenerCloseWithPendingHandshakes: Close returns promptly while
// handshakes are under way, a blocked Accept fails with net.ErrClosed, and
// no goroutine of the listener outlives it.
func TestListenerCloseWithPendingHandshakes(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1")
	before := runtime.NumGoroutine()
	l, err := NetConfig{HandshakeTimeout: 30 * time.Second}.Listen(context.Background(), "127.0.0.1:0", serverCfg(t, dirs["edge1"]))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		silent(t, l.Addr().String(), "")
	}
	// One that sent part of a ClientHello, and a handshaked agent nobody
	// accepted.
	half := silent(t, l.Addr().String(), "")
	if _, err := half.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	acc := make(chan error, 1)
	go func() {
		_, err := l.Accept(context.Background())
		acc <- err
	}()
	// The blocked Accept may take the partial client's outcome only after
	// Close; give it a moment to block.
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v with handshakes under way", d)
	}
	select {
	case err := <-acc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Accept still blocked after Close")
	}
	if _, err := l.Accept(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed listener: %v, want net.ErrClosed", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before the listener:\n%s", runtime.NumGoroutine(), before, leakedGoroutines())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

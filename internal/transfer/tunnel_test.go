package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
)

type spliceResult struct {
	st  SpliceStats
	err error
}

// startTunnel starts both sides for a tunnel to target. The source's
// ServeTunnel results arrive on the returned channel.
func startTunnel(t testing.TB, ctx context.Context, target, token string, check func(TunnelRequest) error) (*Tunnel, <-chan spliceResult, context.CancelFunc) {
	t.Helper()
	dirs, _ := nodes(t, nil, "src", "dst")
	l := listen(t, dirs["src"])
	srcCtx, srcStop := context.WithCancel(context.Background())
	served := make(chan spliceResult, 16)
	var wg sync.WaitGroup
	wg.Go(func() { // the source agent's accept loop
		for {
			c, err := l.Accept(srcCtx)
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				typ, body, err := c.ReadMsg(srcCtx)
				if err != nil || typ != MsgTunnel {
					served <- spliceResult{err: fmt.Errorf("first message %q: %v", typ, err)}
					return
				}
				st, err := c.ServeTunnel(srcCtx, body, check)
				served <- spliceResult{st, err}
			})
		}
	})
	t.Cleanup(func() { srcStop(); l.Close(); wg.Wait() })

	cfg := clientCfg(t, dirs["dst"], "src")
	tun, err := TunnelListen(ctx, "127.0.0.1:0", TunnelRequest{Target: target, Token: token},
		func(ctx context.Context) (*Conn, error) { return Dial(ctx, l.Addr().String(), cfg) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tun.Close() })
	return tun, served, srcStop
}

func tokenCheck(want string) func(TunnelRequest) error {
	return func(r TunnelRequest) error {
		if r.Token != want {
			return errors.New("bad token")
		}
		return nil
	}
}

// serveTarget runs handle for every connection to a loopback listener until
// the test ends, and counts the connections.
func serveTarget(t testing.TB, handle func(*net.TCPConn)) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			accepted.Add(1)
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String(), accepted
}

// echo copies everything back and half-closes when the client did.
func echo(c *net.TCPConn) {
	buf := make([]byte, 256<<10)
	if _, err := io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, buf); err == nil {
		c.CloseWrite()
	}
}

// pattern is a deterministic byte stream that is cheap to make and check:
// block k of the stream is base rotated by k*7919 bytes, so a lost,
// repeated or reordered block shows.
type pattern struct{ base []byte }

func newPattern() pattern { return pattern{randomBytes(1<<20+13, 42)} }

// fill writes the stream's bytes from offset off into p.
func (pt pattern) fill(off int64, p []byte) {
	L := int64(len(pt.base))
	for len(p) > 0 {
		k, i := off/L, off%L
		start := (i + k*7919) % L
		// Copy up to the end of this block and of base's wrap-around.
		n := min(int64(len(p)), L-i, L-start)
		copy(p, pt.base[start:start+n])
		p, off = p[n:], off+n
	}
}

// patternReader yields size bytes of the pattern.
type patternReader struct {
	pt        pattern
	off, size int64
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.size-r.off)]
	r.pt.fill(r.off, p)
	r.off += int64(len(p))
	return len(p), nil
}

// checkPattern reads r to EOF and returns how many bytes matched the
// pattern before the first difference.
func checkPattern(r io.Reader, pt pattern) (int64, error) {
	buf := make([]byte, 256<<10)
	want := make([]byte, len(buf))
	var off int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			pt.fill(off, want[:n])
			if !bytes.Equal(buf[:n], want[:n]) {
				i := 0
				for buf[i] == want[i] {
					i++
				}
				return off + int64(i), fmt.Errorf("byte %d differs", off+int64(i))
			}
			off += int64(n)
		}
		if err == io.EOF {
			return off, nil
		}
		if err != nil {
			return off, err
		}
	}
}

func dialTunnel(t testing.TB, tun *Tunnel) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, tun.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitServed(t *testing.T, served <-chan spliceResult) spliceResult {
	t.Helper()
	select {
	case r := <-served:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("source did not finish serving the tunnel")
		return spliceResult{}
	}
}

// TestTunnelEchoIntegrity sends 200 MB through the tunnel to an echo
// server while reading the echo back, and checks every byte both ways.
func TestTunnelEchoIntegrity(t *testing.T) {
	size := int64(200 << 20)
	if testing.Short() {
		size = 20 << 20
	}
	target, _ := serveTarget(t, echo)
	tun, served, _ := startTunnel(t, context.Background(), target, "s3cret", tokenCheck("s3cret"))
	c := dialTunnel(t, tun)
	pt := newPattern()

	start := time.Now()
	var werr error
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 256<<10)
		_, werr = io.CopyBuffer(struct{ io.Writer }{c}, &patternReader{pt: pt, size: size}, buf)
		if werr == nil {
			werr = c.CloseWrite()
		}
	})
	got, rerr := checkPattern(c, pt)
	wg.Wait()
	elapsed := time.Since(start)
	if werr != nil || rerr != nil || got != size {
		t.Fatalf("write: %v; read %d of %d bytes: %v", werr, got, size, rerr)
	}
	t.Logf("%d MB each way through the TLS tunnel in %v: %.0f MB/s each way", size>>20, elapsed.Round(time.Millisecond), float64(size)/elapsed.Seconds()/1e6)

	r := waitServed(t, served)
	if r.err != nil || r.st.ToTarget != size || r.st.FromTarget != size {
		t.Errorf("source: %+v, %v; want %d bytes each way", r.st, r.err, size)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if st := tun.Stats(); st.Conns != 1 || st.Active != 0 || st.Failed != 0 || st.Up != size || st.Down != size {
			return fmt.Errorf("tunnel stats %+v", st)
		}
		return nil
	})
}

// TestTunnelHalfClose checks that each side's end of data passes through
// while the other direction keeps flowing, in both orders.
func TestTunnelHalfClose(t *testing.T) {
	request := bytes.Repeat([]byte("page request;"), 10000)
	reply := fmt.Sprintf("got %d bytes %x", len(request), sha256.Sum256(request))
	tests := []struct {
		name string
		// target is the service behind the tunnel; it returns what it
		// received.
		target func(*net.TCPConn) []byte
		client func(*net.TCPConn) (string, error)
		want   string
	}{
		{
			// The client finishes first: the target sees EOF, then answers
			// and closes; the client gets the answer and EOF.
			name: "client first",
			target: func(c *net.TCPConn) []byte {
				b, err := io.ReadAll(c)
				if err != nil {
					return nil
				}
				fmt.Fprintf(c, "got %d bytes %x", len(b), sha256.Sum256(b))
				return b
			},
			client: func(c *net.TCPConn) (string, error) {
				if _, err := c.Write(request); err != nil {
					return "", err
				}
				if err := c.CloseWrite(); err != nil {
					return "", err
				}
				b, err := io.ReadAll(c)
				return string(b), err
			},
			want: reply,
		},
		{
			// The target finishes first (greets and half-closes); the
			// client sees the greeting and EOF, then sends its data, which
			// the target still receives, then gets EOF again.
			name: "target first",
			target: func(c *net.TCPConn) []byte {
				if _, err := io.WriteString(c, "hello"); err != nil || c.CloseWrite() != nil {
					return nil
				}
				b, _ := io.ReadAll(c)
				return b
			},
			client: func(c *net.TCPConn) (string, error) {
				greeting, err := io.ReadAll(c)
				if err != nil {
					return "", err
				}
				if _, err := c.Write(request); err != nil {
					return "", err
				}
				if err := c.CloseWrite(); err != nil {
					return "", err
				}
				if rest, err := io.ReadAll(c); err != nil || len(rest) != 0 {
					return "", fmt.Errorf("after EOF: %q, %v", rest, err)
				}
				return string(greeting), nil
			},
			want: "hello",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			received := make(chan []byte, 1)
			target, _ := serveTarget(t, func(c *net.TCPConn) { received <- tc.target(c) })
			tun, served, _ := startTunnel(t, context.Background(), target, "tok", tokenCheck("tok"))
			c := dialTunnel(t, tun)
			got, err := tc.client(c)
			if err != nil || got != tc.want {
				t.Fatalf("client got %q, %v; want %q", got, err, tc.want)
			}
			if b := <-received; !bytes.Equal(b, request) {
				t.Errorf("target received %d bytes, want the %d-byte request", len(b), len(request))
			}
			r := waitServed(t, served)
			if r.err != nil {
				t.Fatalf("source: %v", r.err)
			}
			if r.st.ToTarget != int64(len(request)) || r.st.FromTarget != int64(len(tc.want)) {
				t.Errorf("source carried %d bytes to the target and %d back, want %d and %d",
					r.st.ToTarget, r.st.FromTarget, len(request), len(tc.want))
			}
		})
	}
}

// TestTunnelCancel tears a busy tunnel down from either side; both sides
// and the local client must notice promptly.
func TestTunnelCancel(t *testing.T) {
	for _, side := range []string{"destination", "source"} {
		t.Run(side, func(t *testing.T) {
			target, _ := serveTarget(t, echo)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tun, served, srcStop := startTunnel(t, ctx, target, "tok", tokenCheck("tok"))
			c := dialTunnel(t, tun)

			// Keep data flowing both ways until the tunnel dies.
			var wg sync.WaitGroup
			wg.Go(func() { _, _ = io.Copy(c, &patternReader{pt: newPattern(), size: 1 << 40}) })
			var moved atomic.Int64
			readDone := make(chan error, 1)
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					moved.Add(int64(n))
					if err != nil {
						readDone <- err
						return
					}
				}
			}()
			testutil.Eventually(t, 10*time.Second, func() error {
				if moved.Load() < 4<<20 {
					return fmt.Errorf("only %d bytes echoed", moved.Load())
				}
				return nil
			})

			t0 := time.Now()
			if side == "destination" {
				cancel()
			} else {
				srcStop()
			}
			select {
			case <-readDone:
			case <-time.After(5 * time.Second):
				t.Fatal("local client still connected 5 s after the cancel")
			}
			r := waitServed(t, served)
			if r.err == nil {
				t.Errorf("source splice ended without error after the %s cancelled", side)
			}
			if side == "source" && !errors.Is(r.err, context.Canceled) {
				t.Errorf("source splice error %v, want context.Canceled", r.err)
			}
			if d := time.Since(t0); d > 5*time.Second {
				t.Errorf("teardown took %v", d)
			}
			c.Close() // unblocks the writer
			wg.Wait()
			if side == "source" {
				testutil.Eventually(t, 10*time.Second, func() error {
					if st := tun.Stats(); st.Failed != 1 || st.LastErr == nil || st.Active != 0 {
						return fmt.Errorf("tunnel stats %+v", st)
					}
					return nil
				})
			}
		})
	}
}

// TestTunnelRefused covers requests the source must not serve: a target
// that refuses connections and a token the caller's check rejects. The
// local client's connection ends without data and the tunnel reports why.
func TestTunnelRefused(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := closed.Addr().String()
	closed.Close()

	tests := []struct {
		name       string
		badTarget  bool
		token      string
		wantReason string
	}{
		{"target refuses", true, "tok", "connection refused"},
		{"wrong token", false, "guess", "bad token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			target, accepted := serveTarget(t, echo)
			if tc.badTarget {
				target = refusing
			}
			tun, served, _ := startTunnel(t, context.Background(), target, tc.token, tokenCheck("tok"))
			c := dialTunnel(t, tun)
			_, _ = c.Write([]byte("anyone there?"))
			b, _ := io.ReadAll(c) // EOF or reset: either way nothing comes back
			if len(b) != 0 {
				t.Errorf("client got %q through a refused tunnel", b)
			}
			r := waitServed(t, served)
			if !errors.Is(r.err, ErrTunnelRefused) || !strings.Contains(r.err.Error(), tc.wantReason) {
				t.Errorf("source: %v; want ErrTunnelRefused with %q", r.err, tc.wantReason)
			}
			testutil.Eventually(t, 10*time.Second, func() error {
				st := tun.Stats()
				if st.Failed != 1 || !errors.Is(st.LastErr, ErrTunnelRefused) || !strings.Contains(st.LastErr.Error(), tc.wantReason) {
					return fmt.Errorf("tunnel stats %+v", st)
				}
				return nil
			})
			if n := accepted.Load(); n != 0 {
				t.Errorf("target saw %d connections through a refused tunnel", n)
			}
		})
	}
}

// TestSpliceForwardsBufferedBytes: bytes that arrived right behind the
// tunnel request, already in the connection's read buffer, reach the
// target first, and the reply arrives in order after the answer message.
func TestSpliceForwardsBufferedBytes(t *testing.T) {
	target, _ := serveTarget(t, echo)
	a, b := tcpPair(t)
	dst, src := NewConn(a), NewConn(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A message, the request and raw bytes in one write, so the source's
	// reader buffers the raw bytes together with the frames.
	var wire []byte
	for _, m := range []struct {
		typ  string
		body string
	}{{"hello", `{"n":1}`}, {MsgTunnel, `{"target":"` + target + `","token":"tok"}`}} {
		payload, _ := json.Marshal(envelope{Type: m.typ, Body: json.RawMessage(m.body)})
		frame := make([]byte, headerLen+len(payload))
		copy(frame[headerLen:], payload)
		putHeader(frame, kindMsg, 0, payload, len(payload))
		wire = append(wire, frame...)
	}
	wire = append(wire, chunk("early bytes")...)
	wire = append(wire, chunk("")...)
	if _, err := a.Write(wire); err != nil {
		t.Fatal(err)
	}
	a.(*net.TCPConn).CloseWrite()

	done := make(chan spliceResult, 1)
	go func() {
		if typ, _, err := src.ReadMsg(ctx); err != nil || typ != "hello" {
			done <- spliceResult{err: fmt.Errorf("first message %q: %v", typ, err)}
			return
		}
		typ, body, err := src.ReadMsg(ctx)
		if err != nil || typ != MsgTunnel {
			done <- spliceResult{err: fmt.Errorf("second message %q: %v", typ, err)}
			return
		}
		if src.br.Buffered() == 0 {
			done <- spliceResult{err: errors.New("test setup: nothing buffered behind the request")}
			return
		}
		st, err := src.ServeTunnel(ctx, body, tokenCheck("tok"))
		done <- spliceResult{st, err}
	}()

	typ, _, err := dst.ReadMsg(ctx)
	if err != nil || typ != msgTunnelOK {
		t.Fatalf("answer %q, %v", typ, err)
	}
	var echoed bytes.Buffer
	var n atomic.Int64
	err = copyUnchunked(&echoed, dst.br, &n)
	if err != nil || echoed.String() != "early bytes" {
		t.Fatalf("echo %q, %v", echoed.String(), err)
	}
	if r := <-done; r.err != nil || r.st.ToTarget != 11 || r.st.FromTarget != 11 {
		t.Fatalf("source: %+v, %v", r.st, r.err)
	}
	// The source's Conn was handed over: nothing else goes through it.
	if err := src.WriteMsg(ctx, "late", nil); err == nil {
		t.Error("WriteMsg after Splice succeeded")
	}
}

// TestTunnelTornDownResetsTarget: a tunnel torn down (either side
// cancelled) resets its connection to the target, even an idle one: end
// of file is what a finished byte stream looks like, and CRIU's page
// server takes it for a session that succeeded.
func TestTunnelTornDownResetsTarget(t *testing.T) {
	for _, side := range []string{"destination", "source"} {
		t.Run(side, func(t *testing.T) {
			ended := make(chan error, 1)
			target, _ := serveTarget(t, func(c *net.TCPConn) {
				_, err := io.Copy(io.Discard, struct{ io.Reader }{c})
				ended <- err
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tun, served, srcStop := startTunnel(t, ctx, target, "tok", tokenCheck("tok"))
			c := dialTunnel(t, tun)
			defer c.Close()
			if _, err := c.Write([]byte("request")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // spliced, idle
			if side == "destination" {
				cancel()
			} else {
				srcStop()
			}
			select {
			case err := <-ended:
				if err == nil {
					t.Fatal("the target saw end of file, not a reset")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the target's connection outlived the tunnel")
			}
			waitServed(t, served)
		})
	}
}

// chunk is p as one tunnel chunk; "" is the end marker.
func chunk(p string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(p)))
	return append(b, p...)
}

// TestTunnelPeerGoneResetsTarget: when the agent at one end of a tunnel
// dies, its kernel ends the connection with a plain FIN (over TLS, at a
// record boundary and without close_notify), which must not pass for the
// end of the byte stream: the target's connection is reset. Only the end
// marker ends a direction.
func TestTunnelPeerGoneResetsTarget(t *testing.T) {
	for _, tc := range []struct {
		name string
		send []byte // what the dying peer sent after the answer
		want string // "reset", or "eof" with the payload before it
	}{
		{"no marker", chunk("request"), "reset"},
		{"inside a chunk", chunk("request")[:6], "reset"},
		{"marker", append(chunk("request"), chunk("")...), "eof"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type ending struct {
				got []byte
				err error
			}
			ended := make(chan ending, 1)
			target, _ := serveTarget(t, func(c *net.TCPConn) {
				got, err := io.ReadAll(struct{ io.Reader }{c})
				ended <- ending{got, err}
			})
			dirs, _ := nodes(t, nil, "src", "dst")
			src, dst := tlsPair(t, dirs, "src", "dst")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			served := make(chan spliceResult, 1)
			go func() {
				typ, body, err := src.ReadMsg(ctx)
				if err != nil || typ != MsgTunnel {
					served <- spliceResult{err: fmt.Errorf("first message %q: %v", typ, err)}
					return
				}
				st, err := src.ServeTunnel(ctx, body, tokenCheck("tok"))
				served <- spliceResult{st, err}
			}()
			if err := dst.WriteMsg(ctx, MsgTunnel, TunnelRequest{Target: target, Token: "tok"}); err != nil {
				t.Fatal(err)
			}
			if typ, _, err := dst.ReadMsg(ctx); err != nil || typ != msgTunnelOK {
				t.Fatalf("answer %q, %v", typ, err)
			}
			if _, err := dst.nc.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			// The dying agent's kernel: FIN under TLS, nothing unread.
			if err := dst.raw.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			var e ending
			select {
			case e = <-ended:
			case <-time.After(5 * time.Second):
				t.Fatal("the target's connection outlived the peer")
			}
			r := waitServed(t, served)
			switch tc.want {
			case "reset":
				if e.err == nil {
					t.Fatalf("the target saw end of file after %q, not a reset", e.got)
				}
				if !errors.Is(r.err, ErrTruncated) {
					t.Errorf("source's error %v, want ErrTruncated", r.err)
				}
			case "eof":
				if e.err != nil || string(e.got) != "request" {
					t.Fatalf("target read %q, %v; want the request and end of file", e.got, e.err)
				}
			}
		})
	}
}

// TestTunnelRejectsOversizedChunk: a chunk longer than any sender writes
// is corrupt input, not a reason to allocate or wait.
func TestTunnelRejectsOversizedChunk(t *testing.T) {
	var hdr [chunkHeaderLen]byte
	binary.BigEndian.PutUint32(hdr[:], maxChunk+1)
	var n atomic.Int64
	err := copyUnchunked(io.Discard, bytes.NewReader(hdr[:]), &n)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
}

package transfer

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/pki"
)

// ProtocolVersion is sent by the accepting side right after the handshake;
// the dialling side refuses a peer that speaks another version. Version 2
// sends a tunnel's bytes in chunks with an end marker (see MsgTunnel).
const ProtocolVersion = 2

const helloType = "transfer.hello"

type hello struct {
	Version int    `json:"version"`
	Node    string `json:"node,omitempty"`
}

// Defaults for NetConfig.
const (
	// DefaultBufferBytes is the socket buffer aimed for: twice the
	// bandwidth-delay product of 1 Gbit/s at 300 ms RTT (37.5 MB), since
	// the kernel counts its own overhead in the buffer and advertises
	// about half of it as window.
	DefaultBufferBytes      = 75_000_000
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxHandshakes bounds the handshakes a Listener runs at once
	// (and their goroutines), DefaultMaxHandshakesPerSource those from one
	// source address: an agent opens one connection per migration and
	// one per page tunnel, each handshaked within milliseconds.
	DefaultMaxHandshakes          = 64
	DefaultMaxHandshakesPerSource = 4
	// DefaultUserTimeout bounds unacknowledged data (TCP_USER_TIMEOUT):
	// a cut link fails a migration's connection within it.
	DefaultUserTimeout = 15 * time.Second
)

// NetConfig holds the transport settings of Dial and Listen. The zero
// value uses the defaults.
type NetConfig struct {
	// BufferBytes is the socket send and receive buffer aimed for. The
	// receive buffer is set before the handshake (openWindow), so the
	// window is open from the first byte. The send buffer is left to
	// autotuning when the kernel's net.ipv4.tcp_wmem maximum reaches it,
	// otherwise set explicitly when net.core.wmem_max allows. Where a
	// limit keeps either smaller, Conn.SocketNote says which.
	BufferBytes int
	// HandshakeTimeout bounds TLS handshakes (within the ctx).
	HandshakeTimeout time.Duration
	// MaxHandshakes and MaxHandshakesPerSource bound the handshakes a
	// Listener has under way, in all and from one source address; a
	// connection over either limit is reset at once.
	MaxHandshakes          int
	MaxHandshakesPerSource int
	// UserTimeout is the connection's TCP_USER_TIMEOUT: how long sent
	// data may go unacknowledged (keepalive probes included) before the
	// connection fails.
	UserTimeout time.Duration
}

func (nc NetConfig) withDefaults() NetConfig {
	if nc.BufferBytes == 0 {
		nc.BufferBytes = DefaultBufferBytes
	}
	if nc.HandshakeTimeout == 0 {
		nc.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if nc.UserTimeout == 0 {
		nc.UserTimeout = DefaultUserTimeout
	}
	if nc.MaxHandshakes <= 0 {
		nc.MaxHandshakes = DefaultMaxHandshakes
	}
	if nc.MaxHandshakesPerSource <= 0 {
		nc.MaxHandshakesPerSource = DefaultMaxHandshakesPerSource
	}
	return nc
}

// keepAlive notices a silent dead peer on an idle connection within about
// 11 s; a busy one is bounded by the callers' ctx.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3}

// Dial connects to the agent at addr with NetConfig's defaults.
func Dial(ctx context.Context, addr string, cfg *tls.Config) (*Conn, error) {
	return NetConfig{}.Dial(ctx, addr, cfg)
}

// Dial connects to the agent at addr, authenticates both sides with cfg
// (from pki.ClientConfig, which names the node expected there) and waits
// for the agent's greeting, so that a client certificate the agent refused
// fails here rather than at the first read. Conn.Peer is the agent's
// verified node name.
func (nc NetConfig) Dial(ctx context.Context, addr string, cfg *tls.Config) (*Conn, error) {
	nc = nc.withDefaults()
	cfg, err := prepareTLS(cfg)
	if err != nil {
		return nil, err
	}
	var wnote string
	d := net.Dialer{KeepAliveConfig: keepAlive, Control: openWindow(nc.BufferBytes, &wnote)}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to agent at %s: %w", addr, context.Cause(ctx))
		}
		return nil, fmt.Errorf("connect to agent at %s: %w (check that the edgehop agent is running there and listening on that address)", addr, err)
	}
	note := joinNotes(wnote, tuneBuffers(raw.(*net.TCPConn), nc.BufferBytes))
	if err := linux.SetTCPUserTimeout(raw.(*net.TCPConn), nc.UserTimeout); err != nil {
		note = joinNotes(note, err.Error())
	}

	hctx, cancel := context.WithTimeout(ctx, nc.HandshakeTimeout)
	defer cancel()
	tc := tls.Client(raw, cfg)
	c, err := handshake(hctx, tc, false)
	if err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("agent at %s: %w", addr, err)
	}
	c.note = note
	return c, nil
}

// handshake completes the TLS handshake, learns the peer's node name and
// exchanges the greeting: the accepting side sends it, the dialling side
// reads it.
func handshake(ctx context.Context, tc *tls.Conn, accepting bool) (*Conn, error) {
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	peer, err := pki.PeerName(tc.ConnectionState())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	c := NewConn(tc)
	c.peer = peer
	if accepting {
		if err := c.WriteMsg(ctx, helloType, hello{Version: ProtocolVersion}); err != nil {
			return nil, fmt.Errorf("%w: greet %s: %w", ErrHandshake, peer, err)
		}
		return c, nil
	}
	typ, body, err := c.ReadMsg(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: greeting from %s: %w", ErrHandshake, peer, err)
	}
	if err := checkHello(typ, body); err != nil {
		return nil, fmt.Errorf("%w: %s %w", ErrHandshake, peer, err)
	}
	return c, nil
}

// checkHello checks the accepting side's greeting, the first message a
// dialling side reads (its type and body as ReadMsg returns them).
func checkHello(typ string, body []byte) error {
	var h hello
	if typ != helloType || json.Unmarshal(body, &h) != nil {
		return fmt.Errorf("sent %q instead of a greeting", typ)
	}
	if h.Version != ProtocolVersion {
		return fmt.Errorf("speaks transfer protocol %d, this agent %d", h.Version, ProtocolVersion)
	}
	return nil
}

// prepareTLS copies cfg with the settings this protocol relies on: TLS 1.3
// and full-size records from the first byte (bulk transfer, not web pages).
func prepareTLS(cfg *tls.Config) (*tls.Config, error) {
	if cfg == nil || len(cfg.Certificates) == 0 {
		return nil, errors.New("transfer: TLS config with a node certificate required (see package pki)")
	}
	cfg = cfg.Clone()
	cfg.MinVersion = tls.VersionTLS13
	cfg.DynamicRecordSizingDisabled = true
	return cfg, nil
}

// Listener accepts authenticated agent connections. It is safe for
// concurrent use: concurrent Accept calls each get a different connection.
//
// Handshakes run concurrently, each in its own goroutine bounded by
// NetConfig.HandshakeTimeout, outside any lock: a client that connects and
// stays silent delays nobody else. At most NetConfig.MaxHandshakesPerSource
// of them may be under way from one source address and MaxHandshakes in
// all; a connection over either limit is reset at once.
type Listener struct {
	ln   *net.TCPListener
	cfg  *tls.Config
	nc   NetConfig
	note string // openWindow's, for every connection

	// ctx ends on Close: it aborts the handshakes under way and stops
	// their delivery.
	ctx    context.Context
	cancel context.CancelFunc
	// accepted hands each handshake's outcome to an Accept call.
	// Unbuffered: nothing is left in it on Close.
	accepted chan acceptResult
	loopDone chan struct{} // closed when the accept loop has ended
	loopErr  error         // why, set before loopDone closes
	wg       sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	mu         sync.Mutex
	handshakes int                // goroutines of handshakes, delivered or not
	perSource  map[netip.Addr]int // handshakes under way from each address
}

// acceptResult is one handshake's outcome.
type acceptResult struct {
	c   *Conn
	err error
}

// Listen listens on addr with NetConfig's defaults.
func Listen(ctx context.Context, addr string, cfg *tls.Config) (*Listener, error) {
	return NetConfig{}.Listen(ctx, addr, cfg)
}

// Listen listens for agents on addr (host:port; port 0 picks one) and
// authenticates them with cfg (from pki.ServerConfig). Connections are
// accepted and handshaked from now on, until Close.
func (nc NetConfig) Listen(ctx context.Context, addr string, cfg *tls.Config) (*Listener, error) {
	cfg, err := prepareTLS(cfg)
	if err != nil {
		return nil, err
	}
	nc = nc.withDefaults()
	l := &Listener{cfg: cfg, nc: nc, accepted: make(chan acceptResult), loopDone: make(chan struct{}), perSource: map[netip.Addr]int{}}
	lc := net.ListenConfig{KeepAliveConfig: keepAlive, Control: openWindow(nc.BufferBytes, &l.note)}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	l.ln = ln.(*net.TCPListener)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening, aborts the handshakes under way and waits for
// them; a blocked Accept returns an error wrapping net.ErrClosed.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		l.closeErr = l.ln.Close()
		l.wg.Wait()
	})
	return l.closeErr
}

// Accept waits for the next agent that completed its handshake; Conn.Peer
// is its verified node name, which the caller checks against its plan. A
// client that failed the handshake gives an error wrapping ErrHandshake
// and the listener stays usable; loop on it. After Close the error wraps
// net.ErrClosed.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	select {
	case r := <-l.accepted:
		return r.c, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("accept: %w", context.Cause(ctx))
	case <-l.loopDone:
		return nil, l.loopErr
	}
}

// acceptLoop accepts connections until Close and starts a handshake for
// each that the limits admit.
func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	defer close(l.loopDone)
	var backoff time.Duration
	for {
		raw, err := l.ln.AcceptTCP()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				l.loopErr = fmt.Errorf("accept on %s: %w", l.ln.Addr(), net.ErrClosed)
				return
			}
			// Out of file descriptors and the like: tell an Accept
			// caller, and back off as net/http does.
			if !l.deliver(acceptResult{err: fmt.Errorf("accept on %s: %w", l.ln.Addr(), err)}) {
				continue // closed: the next AcceptTCP fails
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(backoff):
			case <-l.ctx.Done():
			}
			continue
		}
		backoff = 0
		src := sourceOf(raw)
		if !l.admit(src) {
			_ = raw.SetLinger(0) // a reset: nothing to wait for
			_ = raw.Close()
			continue
		}
		l.wg.Add(1)
		go l.serveHandshake(raw, src)
	}
}

// sourceOf is the address a connection comes from, the key of the
// per-source limit.
func sourceOf(raw *net.TCPConn) netip.Addr {
	if a, ok := raw.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// admit counts a handshake from src in, unless that exceeds a limit.
func (l *Listener) admit(src netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handshakes >= l.nc.MaxHandshakes || l.perSource[src] >= l.nc.MaxHandshakesPerSource {
		return false
	}
	l.handshakes++
	l.perSource[src]++
	return true
}

// serveHandshake authenticates raw and hands the outcome to an Accept
// call. Its slot of the per-source limit is given back once the handshake
// is over, its slot of the global one once the outcome was delivered.
func (l *Listener) serveHandshake(raw *net.TCPConn, src netip.Addr) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		l.handshakes--
		l.mu.Unlock()
	}()
	note := joinNotes(l.note, tuneBuffers(raw, l.nc.BufferBytes))
	if err := linux.SetTCPUserTimeout(raw, l.nc.UserTimeout); err != nil {
		note = joinNotes(note, err.Error())
	}
	hctx, cancel := context.WithTimeout(l.ctx, l.nc.HandshakeTimeout)
	c, err := handshake(hctx, tls.Server(raw, l.cfg), true)
	cancel()
	l.mu.Lock()
	if l.perSource[src]--; l.perSource[src] == 0 {
		delete(l.perSource, src)
	}
	l.mu.Unlock()
	if err != nil {
		_ = raw.Close()
		if l.ctx.Err() == nil {
			l.deliver(acceptResult{err: fmt.Errorf("accept from %s: %w", raw.RemoteAddr(), err)})
		}
		return
	}
	c.note = note
	if !l.deliver(acceptResult{c: c}) {
		c.abort()
	}
}

// deliver hands r to an Accept call; false when the listener was closed
// first.
func (l *Listener) deliver(r acceptResult) bool {
	select {
	case l.accepted <- r:
		return true
	case <-l.ctx.Done():
		return false
	}
}

// openWindow returns the Control of a dialer or listener that sizes the
// socket's receive buffer for want bytes before its handshake, and the
// note it leaves when the kernel's limits keep the buffer smaller. The
// window a socket offers starts from that buffer, and autotuning opens it
// only as data arrives: a migration's connection carries a few small
// messages before the freeze and then the images all at once, which a
// window still at its start (about 64 KB) lets through in several round
// trips inside the frozen window. A listener's connections take its
// buffer.
func openWindow(want int, note *string) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) {
			// SO_RCVBUFFORCE passes net.core.rmem_max (CAP_NET_ADMIN).
			if linux.SetReadBufferForceFD(fd, want) == nil {
				return
			}
			coreMax, err := sysctlField("net.core.rmem_max", 0)
			if err == nil && coreMax >= want {
				err = linux.SetReadBufferFD(fd, want)
			} else if err == nil {
				err = fmt.Errorf("net.core.rmem_max=%d", coreMax)
			}
			if err != nil {
				*note = fmt.Sprintf("receive window left to autotuning (opens as data arrives): %v", err)
			}
		})
	}
}

// tuneBuffers sizes tc's send buffer for want bytes and returns a note
// when the kernel's limits keep it smaller. Autotuning is preferred: it
// grows the buffer as the window opens, and an explicit size disables it.
func tuneBuffers(tc *net.TCPConn, want int) string {
	tcpMax, err1 := sysctlField("net.ipv4.tcp_wmem", 2)
	coreMax, err2 := sysctlField("net.core.wmem_max", 0)
	switch {
	case err1 != nil || err2 != nil:
		return fmt.Sprintf("send buffer left to the kernel: %v", errors.Join(err1, err2))
	case tcpMax >= want:
		// autotuning grows the buffer as far as needed
	case coreMax >= want:
		if err := tc.SetWriteBuffer(want); err != nil {
			return fmt.Sprintf("set send buffer: %v", err)
		}
	default:
		return fmt.Sprintf("send buffer limited to %d bytes by net.ipv4.tcp_wmem (max) and net.core.wmem_max=%d, want %d for 1 Gbit/s at 300 ms RTT",
			max(tcpMax, coreMax), coreMax, want)
	}
	return ""
}

// joinNotes joins the non-empty notes with "; ".
func joinNotes(notes ...string) string {
	var out []string
	for _, n := range notes {
		if n != "" {
			out = append(out, n)
		}
	}
	return strings.Join(out, "; ")
}

// sysctlField reads field i (space separated) of the sysctl key as seen
// from this process's network namespace.
func sysctlField(key string, i int) (int, error) {
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if i >= len(f) {
		return 0, fmt.Errorf("%s: no field %d in %q", key, i, b)
	}
	return strconv.Atoi(f[i])
}

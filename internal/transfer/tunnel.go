package transfer

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// A tunnel carries one plain TCP connection across an authenticated agent
// connection (for CRIU's page traffic in post-copy: `criu lazy-pages` on
// the destination reaches the source's page server through it).
//
// Protocol, on a fresh connection from the destination (which runs the
// Tunnel) to the source (whose listener hands it to ServeTunnel):
//
//	D→S  message MsgTunnel, body TunnelRequest
//	S→D  message "transfer.tunnel.ok"      the source reached the target
//	  or message "transfer.tunnel.refused" {"reason"}, then the source closes
//	then the byte stream both ways, each direction in chunks:
//	  length uint32 (big-endian, at most maxChunk), then that many bytes;
//	  a chunk of length 0 ends the direction, and its sender then
//	  half-closes (TLS close_notify, or TCP shutdown on a plain Conn).
//	The connection is closed when both directions are done.
//
// The end marker is what tells a finished byte stream from a dead peer:
// the kernel of an agent killed with an empty receive buffer ends its
// connection with a plain FIN, and Go's TLS reads a transport that ends at
// a record boundary without close_notify as a clean end of file. A
// direction that ends without its marker is a failure, and the connection
// to the target is reset, not half-closed (CRIU's page server takes end of
// file for a session that succeeded; a lazy dump then kills the dumped
// tasks, which the source could otherwise resume).
//
// The destination sends nothing after the request until it has the
// answer, so a refusal never races with unread data.

// MsgTunnel is the type of a tunnel request, the first message on a
// connection that a Tunnel opens. The accepting agent reads it with ReadMsg
// and passes its body to ServeTunnel.
const MsgTunnel = "transfer.tunnel"

const (
	msgTunnelOK      = "transfer.tunnel.ok"
	msgTunnelRefused = "transfer.tunnel.refused"
)

// ErrTunnelRefused: the source agent refused a tunnel request (its check
// failed or it could not reach the target).
var ErrTunnelRefused = errors.New("transfer: tunnel refused")

// errSpliced marks a Conn whose byte stream was handed to a tunnel.
var errSpliced = errors.New("transfer: connection handed to a tunnel")

// spliceBufSize is the copy buffer of each tunnel direction. A TLS read
// returns at most one 16 KiB record; plain TCP reads fill more of it.
const spliceBufSize = 256 << 10

// chunkHeaderLen is the length prefix of a tunnel chunk; maxChunk the
// largest chunk a sender writes and a receiver accepts.
const (
	chunkHeaderLen = 4
	maxChunk       = spliceBufSize - chunkHeaderLen
)

// errNoEndMarker: a tunnel direction's transport ended without the chunk
// that ends it, so the peer is gone rather than finished.
var errNoEndMarker = fmt.Errorf("%w: tunnel stream ended without its end marker (peer agent gone?)", ErrTruncated)

// TunnelRequest asks the source agent to connect the tunnel to Target (a
// host:port in its network namespace). Token is for the source agent's
// check (for example a secret it handed out with the migration plan);
// this package does not interpret either field.
type TunnelRequest struct {
	Target string `json:"target"`
	Token  string `json:"token"`
}

type tunnelRefusal struct {
	Reason string `json:"reason"`
}

// SpliceStats counts one tunnelled connection on the source side.
type SpliceStats struct {
	// ToTarget is what went from the tunnel's peer to the target,
	// FromTarget what went back.
	ToTarget, FromTarget int64
	Duration             time.Duration
}

// ServeTunnel serves a tunnel request whose body was just read with
// ReadMsg (type MsgTunnel): it decodes the request and asks check, which
// must accept the peer, target and token; then it splices the connection
// to the target (see Splice). When check returns an error, or the target
// cannot be reached, the peer is told so (its Tunnel reports
// ErrTunnelRefused with the reason) and the returned error wraps
// ErrTunnelRefused. c is closed when ServeTunnel returns.
func (c *Conn) ServeTunnel(ctx context.Context, body json.RawMessage, check func(TunnelRequest) error) (SpliceStats, error) {
	var req TunnelRequest
	err := json.Unmarshal(body, &req)
	switch {
	case err != nil:
		err = fmt.Errorf("bad request: %v", err)
	case req.Target == "":
		err = errors.New("bad request: no target")
	case check == nil:
		err = errors.New("no tunnel check configured")
	default:
		err = check(req)
	}
	if err != nil {
		rerr := c.refuseTunnel(ctx, err.Error())
		return SpliceStats{}, errors.Join(fmt.Errorf("tunnel to %q from %s: %w: %w", req.Target, c.peer, ErrTunnelRefused, err), rerr)
	}
	return c.Splice(ctx, req.Target)
}

// Splice answers a tunnel request on c (whose peer is a Tunnel and whose
// request the caller has read and accepted): it connects to target,
// reports success or failure to the peer, then copies bytes both ways
// until both directions have ended. When one side ends its direction
// (EOF), the other side's direction is half-closed and the other direction
// keeps flowing; an error on either side or the end of ctx tears both
// down. Bytes that arrived after the request and sit in c's read buffer
// go to the target first.
//
// Splice takes c over: no message or stream may follow, and c is closed
// when Splice returns. Calls on c from other goroutines wait until then
// and fail.
func (c *Conn) Splice(ctx context.Context, target string) (st SpliceStats, err error) {
	defer c.Close()
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := errors.Join(c.rerr, c.werr); err != nil {
		return st, fmt.Errorf("splice to %s: %w", target, err)
	}
	c.rerr, c.werr = errSpliced, errSpliced
	c.spliced.Store(true)
	stop := c.watch(ctx)
	defer stop()

	start := time.Now()
	defer func() { st.Duration = time.Since(start) }()
	// Until the pipe has ended cleanly, closing tc resets it, and so does
	// this process's death, from the connect on: the kernel would
	// otherwise end the stream, which is what a finished session looks
	// like (CRIU's lazy page server then kills the dumped tasks, which the
	// source restarted after a crash resumes).
	tc, err := linux.DialAbortive(ctx, target)
	if err != nil {
		err = ctxErr(ctx, err)
		rerr := c.replyLocked(ctx, msgTunnelRefused, tunnelRefusal{Reason: fmt.Sprintf("connect to %s: %v", target, err)})
		return st, errors.Join(fmt.Errorf("splice to %s: %w: %w", target, ErrTunnelRefused, err), rerr)
	}
	defer tc.Close()
	spliceDialed()
	if err := c.replyLocked(ctx, msgTunnelOK, nil); err != nil {
		return st, fmt.Errorf("splice to %s: %w", target, err)
	}
	var to, from atomic.Int64
	err = c.pipeLocked(ctx, tc, &to, &from)
	st.ToTarget, st.FromTarget = to.Load(), from.Load()
	if err != nil {
		return st, fmt.Errorf("splice to %s: %w", target, err)
	}
	_ = tc.SetLinger(-1)
	return st, nil
}

// spliceDialed runs in Splice right after its connection to the target
// is up; a test stops there to kill the process.
var spliceDialed = func() {}

// refuseTunnel tells the peer its tunnel request was refused and closes c.
func (c *Conn) refuseTunnel(ctx context.Context, reason string) error {
	defer c.Close()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	stop := c.watch(ctx)
	defer stop()
	return c.replyLocked(ctx, msgTunnelRefused, tunnelRefusal{Reason: reason})
}

// replyLocked writes and flushes one message. The caller holds wmu.
func (c *Conn) replyLocked(ctx context.Context, typ string, v any) error {
	var body []byte
	if v != nil {
		body, _ = json.Marshal(v)
	}
	payload, _ := json.Marshal(envelope{Type: typ, Body: body})
	if _, err := c.writeControlLocked(kindMsg, payload); err != nil {
		return fmt.Errorf("send %s: %w", typ, ctxErr(ctx, err))
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("send %s: %w", typ, ctxErr(ctx, err))
	}
	return nil
}

// openTunnel sends req on c, waits for the answer and then carries lc's
// bytes both ways until both directions ended (see pipeLocked). up counts
// bytes from lc to the peer, down the other way.
func (c *Conn) openTunnel(ctx context.Context, req TunnelRequest, lc *net.TCPConn, up, down *atomic.Int64) error {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := errors.Join(c.rerr, c.werr); err != nil {
		return err
	}
	c.rerr, c.werr = errSpliced, errSpliced
	c.spliced.Store(true)
	stop := c.watch(ctx)
	defer stop()

	if err := c.replyLocked(ctx, MsgTunnel, req); err != nil {
		return err
	}
	h, payload, err := c.readFrameLocked(true)
	if err != nil {
		return fmt.Errorf("tunnel answer: %w", ctxErr(ctx, err))
	}
	var env envelope
	if h.kind != kindMsg || json.Unmarshal(payload, &env) != nil {
		return fmt.Errorf("%w: tunnel answer is a %s", ErrProtocol, h.kind)
	}
	switch env.Type {
	case msgTunnelOK:
	case msgTunnelRefused:
		var r tunnelRefusal
		_ = json.Unmarshal(env.Body, &r)
		return fmt.Errorf("%w by %s: %s", ErrTunnelRefused, c.peer, r.Reason)
	default:
		return fmt.Errorf("%w: tunnel answer %q", ErrProtocol, env.Type)
	}
	return c.pipeLocked(ctx, lc, down, up)
}

// pipeLocked copies between c, whose framed part is over, and nc until
// both directions have ended, either failed or ctx ended. The direction
// from c arrives in chunks and ends at its end marker, the direction to c
// leaves in chunks and ends with one (see the protocol above); a direction
// that ended half-closes the other end's writing side. toNC counts bytes
// from c's peer to nc, fromNC the other way. The caller holds rmu and wmu,
// watches ctx for c and closes both connections afterwards.
func (c *Conn) pipeLocked(ctx context.Context, nc *net.TCPConn, toNC, fromNC *atomic.Int64) error {
	var (
		mu    sync.Mutex
		first error // the error that tore the pipe down
	)
	// A torn-down pipe resets nc rather than ending it: end of file is
	// what a finished byte stream looks like, and CRIU's page server takes
	// it for a session that succeeded (a lazy dump then kills the dumped
	// tasks, which the source could otherwise resume).
	abortNC := func() {
		_ = nc.SetLinger(0)
		_ = nc.Close()
	}
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		c.abort()
		abortNC()
	}
	stopNC := context.AfterFunc(ctx, abortNC)
	defer stopNC()

	var wg sync.WaitGroup
	wg.Go(func() {
		// c.br first: it may hold bytes that arrived behind the last frame.
		if err := copyUnchunked(nc, c.br, toNC); err != nil {
			fail(fmt.Errorf("peer to %s: %w", nc.RemoteAddr(), err))
			return
		}
		if err := nc.CloseWrite(); err != nil {
			fail(fmt.Errorf("half-close %s: %w", nc.RemoteAddr(), err))
			return
		}
		// Read c to its end, right behind the marker (the peer's TLS
		// close_notify, or its FIN): c closed with bytes unread would
		// send a reset, which makes the peer drop what this side sent it
		// and it had not read yet.
		_, _ = io.Copy(io.Discard, c.br)
	})
	wg.Go(func() {
		if err := copyChunked(c.nc, nc, fromNC); err != nil {
			fail(fmt.Errorf("%s to peer: %w", nc.RemoteAddr(), err))
			return
		}
		if err := c.closeWrite(); err != nil {
			fail(fmt.Errorf("half-close to peer: %w", err))
		}
	})
	wg.Wait()
	return ctxErr(ctx, first)
}

// closeWrite ends c's sending direction: a TLS close_notify, or a TCP
// shutdown on a plain connection.
func (c *Conn) closeWrite() error {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("%T cannot half-close", c.nc)
}

// copyChunked copies src to dst until EOF as tunnel chunks (see the
// protocol above), then writes the end marker; it adds the payload bytes
// it wrote to n as it goes. One large buffer carries each chunk with its
// header in one write.
func copyChunked(dst io.Writer, src io.Reader, n *atomic.Int64) error {
	buf := make([]byte, chunkHeaderLen+maxChunk)
	for {
		m, rerr := src.Read(buf[chunkHeaderLen:])
		if m > 0 {
			binary.BigEndian.PutUint32(buf, uint32(m))
			if _, werr := dst.Write(buf[:chunkHeaderLen+m]); werr != nil {
				return werr
			}
			n.Add(int64(m))
		}
		if rerr == io.EOF {
			binary.BigEndian.PutUint32(buf, 0)
			_, werr := dst.Write(buf[:chunkHeaderLen])
			return werr
		}
		if rerr != nil {
			return rerr
		}
	}
}

// copyUnchunked reads tunnel chunks from src and copies their payload to
// dst as it arrives, until the end marker; it adds what it wrote to n as
// it goes. A src that ends before the marker fails with errNoEndMarker, a
// chunk longer than maxChunk with ErrCorrupt.
func copyUnchunked(dst io.Writer, src io.Reader, n *atomic.Int64) error {
	buf := make([]byte, spliceBufSize)
	for {
		if _, err := io.ReadFull(src, buf[:chunkHeaderLen]); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return errNoEndMarker
			}
			return err
		}
		left := binary.BigEndian.Uint32(buf)
		if left == 0 {
			return nil
		}
		if left > maxChunk {
			return fmt.Errorf("%w: tunnel chunk of %d bytes (at most %d)", ErrCorrupt, left, maxChunk)
		}
		for left > 0 {
			m, rerr := src.Read(buf[:min(int(left), len(buf))])
			if m > 0 {
				if _, werr := dst.Write(buf[:m]); werr != nil {
					return werr
				}
				n.Add(int64(m))
				left -= uint32(m)
			}
			if rerr == io.EOF && left > 0 {
				return errNoEndMarker
			}
			if rerr != nil && rerr != io.EOF {
				return rerr
			}
		}
	}
}

// Tunnel listens on a local TCP address and carries every connection
// accepted there over a new authenticated agent connection to the source
// agent, which splices it to the requested target. It is safe for
// concurrent use.
type Tunnel struct {
	ln     *net.TCPListener
	req    TunnelRequest
	dial   func(context.Context) (*Conn, error)
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and every connection's goroutine

	conns, active, failed atomic.Int64
	up, down              atomic.Int64

	mu      sync.Mutex // guards lastErr
	lastErr error
}

// TunnelStats describes a Tunnel's connections so far.
type TunnelStats struct {
	// Conns counts local connections accepted, Active those still open,
	// Failed those that ended with an error (refused, unreachable, reset).
	Conns, Active, Failed int64
	// Up counts bytes from local clients to the target, Down back.
	Up, Down int64
	// LastErr is the latest connection's error, if any failed.
	LastErr error
}

// TunnelListen listens on localAddr (such as "127.0.0.1:0" in the
// caller's network namespace) and tunnels each connection accepted there:
// it calls dial for a new agent connection (Dial to the source agent's
// migration listener), sends req and, once the source agent has reached
// the target, copies bytes both ways with half-close passed through (see
// Splice). A connection that cannot be tunnelled is closed; Stats records
// why (ErrTunnelRefused when the source agent refused).
//
// The tunnel runs until Close or until ctx ends; either tears down open
// connections.
func TunnelListen(ctx context.Context, localAddr string, req TunnelRequest, dial func(context.Context) (*Conn, error)) (*Tunnel, error) {
	if dial == nil || req.Target == "" {
		return nil, errors.New("tunnel listen: dial function and target required")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", localAddr)
	if err != nil {
		return nil, fmt.Errorf("tunnel listen on %s: %w", localAddr, err)
	}
	t := &Tunnel{ln: ln.(*net.TCPListener), req: req, dial: dial}
	t.ctx, t.cancel = context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, func() { _ = t.ln.Close() })
	t.wg.Go(func() {
		defer stop()
		t.acceptLoop()
	})
	return t, nil
}

// Addr is the local address clients connect to.
func (t *Tunnel) Addr() *net.TCPAddr { return t.ln.Addr().(*net.TCPAddr) }

// Stats returns the tunnel's counters.
func (t *Tunnel) Stats() TunnelStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return TunnelStats{
		Conns: t.conns.Load(), Active: t.active.Load(), Failed: t.failed.Load(),
		Up: t.up.Load(), Down: t.down.Load(), LastErr: t.lastErr,
	}
}

// Close stops listening, tears down open connections and waits for them.
func (t *Tunnel) Close() error {
	t.cancel()
	err := t.ln.Close()
	t.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (t *Tunnel) acceptLoop() {
	for {
		lc, err := t.ln.AcceptTCP()
		if err != nil {
			if t.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			t.record(fmt.Errorf("tunnel accept: %w", err)) // e.g. out of file descriptors
			select {
			case <-t.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		t.conns.Add(1)
		t.active.Add(1)
		t.wg.Go(func() {
			defer t.active.Add(-1)
			if err := t.carry(lc); err != nil {
				t.failed.Add(1)
				t.record(err)
			}
		})
	}
}

// carry tunnels one local connection.
func (t *Tunnel) carry(lc *net.TCPConn) error {
	defer lc.Close()
	rc, err := t.dial(t.ctx)
	if err != nil {
		return fmt.Errorf("tunnel %s to %s: %w", lc.RemoteAddr(), t.req.Target, err)
	}
	defer rc.Close()
	if err := rc.openTunnel(t.ctx, t.req, lc, &t.up, &t.down); err != nil {
		return fmt.Errorf("tunnel %s to %s: %w", lc.RemoteAddr(), t.req.Target, err)
	}
	return nil
}

func (t *Tunnel) record(err error) {
	t.mu.Lock()
	t.lastErr = err
	t.mu.Unlock()
}

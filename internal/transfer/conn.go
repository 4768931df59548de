package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/klauspost/compress/zstd"
)

// Conn is one agent-to-agent connection carrying messages and streams.
//
// A Conn is full duplex: one goroutine may send (WriteMsg, Send*) while
// another receives (ReadMsg, Recv*). Calls in the same direction are
// serialised. An error in the middle of a stream leaves that direction
// unusable (later calls return ErrBroken) because the position in the byte
// stream is lost; ErrAborted is the exception, as the sender ended the
// stream cleanly. When the ctx of any call ends, the whole Conn is closed.
// Splice and ServeTunnel take the Conn over for raw bytes: no message or
// stream follows them.
type Conn struct {
	nc   net.Conn // what frames are written to and read from (TLS or plain)
	raw  net.Conn // the transport under nc, closed to abort blocked calls
	peer string
	note string

	closeOnce sync.Once
	closeErr  error

	sent    atomic.Int64 // bytes handed to nc, for progress reports
	spliced atomic.Bool  // handed to a tunnel (Splice, openTunnel)

	wmu  sync.Mutex // guards everything below up to rmu: the send side
	bw   *bufio.Writer
	werr error // sticky: set when a send failed mid-frame
	enc  *zstd.Encoder
	// dense is the slower, denser encoder for links slow enough that it
	// still outruns them (denseLinkFactor), made on first use.
	dense *zstd.Encoder
	// encSpeed is enc's rate in raw bytes per second as WarmCompression
	// measured it, 0 before; CompressAuto's floor for its speed estimate.
	encSpeed float64
	hdr      [headerLen]byte

	rmu  sync.Mutex // guards everything below: the receive side
	br   *bufio.Reader
	rerr error // sticky: set when a receive failed mid-stream
	dec  *zstd.Decoder
	rbuf []byte // payload buffer reused across frames
	dbuf []byte // decompression buffer reused across frames
}

const (
	writeBufSize = 256 << 10
	readBufSize  = 256 << 10
)

// NewConn wraps an established connection. If nc is a *tls.Conn its
// handshake must be complete and the peer is read from its verified
// certificate; Dial and Listener.Accept do both. Over any other net.Conn
// the peer is unauthenticated and Peer returns "".
func NewConn(nc net.Conn) *Conn {
	c := &Conn{
		nc:  nc,
		raw: nc,
		br:  bufio.NewReaderSize(nc, readBufSize),
	}
	c.bw = bufio.NewWriterSize(countingWriter{nc, &c.sent}, writeBufSize)
	if tc, ok := nc.(*tls.Conn); ok {
		c.raw = tc.NetConn()
	}
	return c
}

// Sent is how many bytes this side has written to the connection so far
// (frames, before TLS); safe to call concurrently with everything.
func (c *Conn) Sent() int64 { return c.sent.Load() }

// countingWriter counts what reaches w.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (cw countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n.Add(int64(n))
	return n, err
}

// Peer returns the authenticated node name of the other agent, or "" on a
// connection without TLS.
func (c *Conn) Peer() string { return c.peer }

// SocketNote returns a warning about socket buffers too small for the
// bandwidth-delay product Dial or Accept aimed for (naming the sysctls to
// raise), or "" when there is nothing to say.
func (c *Conn) SocketNote() string { return c.note }

// LocalAddr and RemoteAddr are the transport addresses.
func (c *Conn) LocalAddr() net.Addr  { return c.raw.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr { return c.raw.RemoteAddr() }

// Close closes the connection. It is safe to call more than once and
// concurrently with other calls, which then fail.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		err := c.nc.Close()
		if errors.Is(err, net.ErrClosed) {
			err = nil
		}
		c.closeErr = err
	})
	return c.closeErr
}

// abort closes the transport under TLS so blocked reads and writes return
// at once; a TLS close would first try to send an alert, which can block on
// a dead peer. A spliced connection is reset: Go's TLS reads a transport
// that ends at a record boundary without close_notify as a clean end, and
// the peer of a tunnel torn down must see it fail, not end.
func (c *Conn) abort() {
	if tc, ok := c.raw.(*net.TCPConn); ok && c.spliced.Load() {
		_ = tc.SetLinger(0)
	}
	_ = c.raw.Close()
}

// watch closes the connection when ctx ends during a call. The returned
// function stops watching, waiting for a close already under way; the
// caller passes its error through ctxErr.
func (c *Conn) watch(ctx context.Context) (stop func()) {
	done := make(chan struct{})
	stopFn := context.AfterFunc(ctx, func() {
		c.abort()
		close(done)
	})
	return func() {
		if !stopFn() {
			<-done
		}
	}
}

// ctxErr replaces err by the context's error when the context ended: the
// I/O error is then only a consequence of closing the connection.
func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (connection closed)", context.Cause(ctx))
	}
	return err
}

// envelope is a message frame's payload.
type envelope struct {
	Type string          `json:"type"`
	Body json.RawMessage `json:"body,omitempty"`
}

// WriteMsg sends one control message of the given type whose body is v
// encoded as JSON, and flushes it.
func (c *Conn) WriteMsg(ctx context.Context, typ string, v any) error {
	if typ == "" {
		return errors.New("write message: empty type")
	}
	payload, err := encodeEnvelope(typ, v)
	if err != nil {
		return fmt.Errorf("write message %s: %w", typ, err)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return fmt.Errorf("write message %s: %w", typ, c.werr)
	}
	stop := c.watch(ctx)
	defer stop()
	if _, err := c.writeControlLocked(kindMsg, payload); err != nil {
		return fmt.Errorf("write message %s: %w", typ, c.failWriteLocked(ctx, err))
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("write message %s: %w", typ, c.failWriteLocked(ctx, err))
	}
	return nil
}

// ReadMsg receives the next control message and returns its type and its
// JSON body (nil when it had none). A peer that closed the connection
// between messages gives an error wrapping io.EOF.
func (c *Conn) ReadMsg(ctx context.Context) (string, json.RawMessage, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.rerr != nil {
		return "", nil, fmt.Errorf("read message: %w", c.rerr)
	}
	stop := c.watch(ctx)
	defer stop()
	h, payload, err := c.readFrameLocked(true)
	if err != nil {
		if err == io.EOF && ctx.Err() == nil {
			return "", nil, fmt.Errorf("read message: peer closed the connection: %w", err)
		}
		return "", nil, fmt.Errorf("read message: %w", c.failReadLocked(ctx, err))
	}
	if h.kind != kindMsg {
		return "", nil, fmt.Errorf("read message: %w", c.failReadLocked(ctx, fmt.Errorf("%w: got %s, want message", ErrProtocol, h.kind)))
	}
	typ, body, err := decodeEnvelope(payload)
	if err != nil {
		return "", nil, fmt.Errorf("read message: %w", c.failReadLocked(ctx, err))
	}
	return typ, body, nil
}

// encodeEnvelope is the payload of a message frame of type typ whose body
// is v as JSON (none when v is nil), at most maxControl bytes.
func encodeEnvelope(typ string, v any) ([]byte, error) {
	var body []byte
	if v != nil {
		var err error
		if body, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	payload, err := json.Marshal(envelope{Type: typ, Body: body})
	if err != nil {
		return nil, err
	}
	if len(payload) > maxControl {
		return nil, fmt.Errorf("%d bytes exceeds %d", len(payload), maxControl)
	}
	return payload, nil
}

// decodeEnvelope decodes a message frame's payload (a peer's bytes, at
// most maxControl of them: readFrameLocked's bound). The body is a copy:
// payload's buffer is reused by the next frame.
func decodeEnvelope(payload []byte) (typ string, body json.RawMessage, err error) {
	var env envelope
	if err := json.Unmarshal(payload, &env); err != nil || env.Type == "" {
		return "", nil, fmt.Errorf("%w: bad message envelope: %v", ErrCorrupt, err)
	}
	return env.Type, env.Body, nil
}

// writeControlLocked writes a small frame through the buffer. It returns
// the bytes written. The caller holds wmu.
func (c *Conn) writeControlLocked(k kind, payload []byte) (int, error) {
	putHeader(c.hdr[:], k, 0, payload, len(payload))
	if _, err := c.bw.Write(c.hdr[:]); err != nil {
		return 0, err
	}
	if _, err := c.bw.Write(payload); err != nil {
		return 0, err
	}
	return headerLen + len(payload), nil
}

// failWriteLocked records a send failure that left the stream mid-frame.
func (c *Conn) failWriteLocked(ctx context.Context, err error) error {
	err = ctxErr(ctx, err)
	c.werr = fmt.Errorf("%w: %w", ErrBroken, err)
	return err
}

// failReadLocked records a receive failure that left the stream at an
// unknown position, and maps a connection that ended into ErrTruncated.
func (c *Conn) failReadLocked(ctx context.Context, err error) error {
	err = ctxErr(ctx, err)
	if ctx.Err() == nil && isEndOfConn(err) && !errors.Is(err, ErrTruncated) {
		err = fmt.Errorf("%w: %w", ErrTruncated, err)
	}
	c.rerr = fmt.Errorf("%w: %w", ErrBroken, err)
	return err
}

// isEndOfConn reports errors meaning the peer went away.
func isEndOfConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed)
}

// readFrameLocked reads and checks one frame. The payload aliases a buffer
// reused by the next call. If boundary is set, a connection that ends
// exactly before the frame gives io.EOF unwrapped (a clean close between
// messages); otherwise any end is ErrTruncated. The caller holds rmu.
func (c *Conn) readFrameLocked(boundary bool) (header, []byte, error) {
	var hb [headerLen]byte
	if _, err := io.ReadFull(c.br, hb[:]); err != nil {
		if err == io.EOF && boundary {
			return header{}, nil, io.EOF
		}
		if isEndOfConn(err) {
			return header{}, nil, fmt.Errorf("%w: %w", ErrTruncated, err)
		}
		return header{}, nil, err
	}
	h, err := parseHeader(hb[:])
	if err != nil {
		return h, nil, err
	}
	if cap(c.rbuf) < int(h.length) {
		c.rbuf = make([]byte, h.length)
	}
	payload := c.rbuf[:h.length]
	if _, err := io.ReadFull(c.br, payload); err != nil {
		if isEndOfConn(err) {
			return h, nil, fmt.Errorf("%w: inside a %s frame: %w", ErrTruncated, h.kind, err)
		}
		return h, nil, err
	}
	if got := crcOf(payload); got != h.dataCRC {
		return h, nil, fmt.Errorf("%w: %s frame checksum %08x, want %08x", ErrCorrupt, h.kind, got, h.dataCRC)
	}
	return h, payload, nil
}

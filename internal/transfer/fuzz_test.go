package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
)

// streamConn is a net.Conn whose peer's bytes are fixed in advance
// (reads) and whose writes are kept: a stream's bytes as a fuzzer gives
// them, or a stream recorded from a sender.
type streamConn struct {
	r   io.Reader
	out bytes.Buffer
}

func (c *streamConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *streamConn) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *streamConn) Close() error                     { return nil }
func (c *streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

// recordDir returns the bytes SendDir puts on the wire for a small tree.
func recordDir(f *testing.F, opts SendOptions) []byte {
	f.Helper()
	src := f.TempDir()
	for p, body := range map[string]string{"a": "hello", "d/b": strings.Repeat("x", 3000), "d/e/c": ""} {
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			f.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.Symlink("../a", filepath.Join(src, "d", "link")); err != nil {
		f.Fatal(err)
	}
	sc := &streamConn{r: bytes.NewReader(nil)}
	if _, err := NewConn(sc).SendDir(context.Background(), src, opts); err != nil {
		f.Fatal(err)
	}
	return sc.out.Bytes()
}

// FuzzParseHeader: any 16 bytes parse or fail cleanly, and what parses
// is within the protocol's bounds.
func FuzzParseHeader(f *testing.F) {
	var b [headerLen]byte
	putHeader(b[:], kindData, 0, []byte("payload"), 7)
	f.Add(b[:])
	f.Add(make([]byte, headerLen))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < headerLen {
			return
		}
		h, err := parseHeader(in[:headerLen])
		if err != nil {
			return
		}
		if h.kind == kindData && (h.rawLen > MaxChunkSize || h.length > h.rawLen) {
			t.Fatalf("parsed a data frame of %d/%d bytes, the bound is %d", h.length, h.rawLen, MaxChunkSize)
		}
		if h.kind != kindData && h.length > maxControl {
			t.Fatalf("parsed a %s frame of %d bytes, the bound is %d", h.kind, h.length, maxControl)
		}
	})
}

// FuzzRecvDir feeds a peer's arbitrary bytes to RecvDir: it must fail
// cleanly or build a tree, never write outside its destination, never
// exceed MaxBytes, and leave no partial directory behind on failure.
func FuzzRecvDir(f *testing.F) {
	f.Add(recordDir(f, SendOptions{}))
	f.Add(recordDir(f, SendOptions{Compression: CompressZstd}))
	f.Add([]byte{})
	const maxBytes = 1 << 20
	f.Fuzz(func(t *testing.T, in []byte) {
		root := t.TempDir()
		dst := filepath.Join(root, "in", "dst")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := NewConn(&streamConn{r: bytes.NewReader(in)}).RecvDir(ctx, dst, RecvOptions{MaxBytes: maxBytes})
		if ctx.Err() != nil {
			t.Fatalf("RecvDir hung on %d bytes of input", len(in))
		}
		// Nothing but dst (on success) may exist under root/in.
		ents, _ := os.ReadDir(filepath.Join(root, "in"))
		for _, e := range ents {
			if e.Name() != "dst" || err != nil {
				t.Fatalf("left %q under the destination's parent (err %v)", e.Name(), err)
			}
		}
		if err != nil {
			return
		}
		if st.PayloadBytes > maxBytes {
			t.Fatalf("accepted %d bytes, more than MaxBytes", st.PayloadBytes)
		}
		// Every entry lies inside dst (symlinks are not followed).
		_ = filepath.WalkDir(dst, func(p string, d fs.DirEntry, werr error) error {
			if werr != nil {
				return nil
			}
			rel, rerr := filepath.Rel(dst, p)
			if rerr != nil || strings.HasPrefix(rel, "..") {
				t.Fatalf("entry %s outside %s", p, dst)
			}
			return nil
		})
	})
}

// TestSendDirLive: a tree whose files are created and removed while it
// is sent (a running service's writable layer) is sent without error in
// live mode, and what arrives is a consistent subset.
func TestSendDirLive(t *testing.T) {
	src := t.TempDir()
	testutil.Churn(t, func(i int) {
		p := filepath.Join(src, "d", "f"+strings.Repeat("x", i%7))
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		_ = os.WriteFile(p, []byte("data"), 0o644)
		_ = os.Link(p, p+"-link")
		_ = os.Remove(p)
		_ = os.Remove(p + "-link")
		if i%50 == 0 {
			_ = os.RemoveAll(filepath.Join(src, "d"))
		}
	})
	for i := 0; i < 200; i++ {
		sc := &streamConn{r: bytes.NewReader(nil)}
		if _, err := NewConn(sc).SendDir(context.Background(), src, SendOptions{Overlay: true, Live: true}); err != nil {
			t.Fatalf("send %d of a live tree: %v", i, err)
		}
		dst := filepath.Join(t.TempDir(), "dst")
		if _, err := NewConn(&streamConn{r: bytes.NewReader(sc.out.Bytes())}).RecvDir(context.Background(), dst, RecvOptions{}); err != nil {
			t.Fatalf("receive %d of a live tree: %v", i, err)
		}
	}
}

// FuzzTunnelChunks feeds a peer's arbitrary bytes to a tunnel direction's
// decoder: it must pass on only payload that the input holds, in order,
// succeed only at an end marker, and never take a chunk beyond maxChunk.
// What it passed on, chunked again, decodes to itself.
func FuzzTunnelChunks(f *testing.F) {
	f.Add(append(chunk("page data"), chunk("")...))
	f.Add(chunk("no marker"))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		var n atomic.Int64
		err := copyUnchunked(&out, bytes.NewReader(in), &n)
		if n.Load() != int64(out.Len()) || out.Len() > len(in) {
			t.Fatalf("passed on %d bytes (counted %d) from %d of input", out.Len(), n.Load(), len(in))
		}
		if err != nil && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("unexpected error %v", err)
		}
		if err == nil {
			// The payload is the input's chunks, without their headers.
			var want []byte
			for r := in; ; {
				l := binary.BigEndian.Uint32(r)
				if l == 0 {
					break
				}
				want = append(want, r[4:4+l]...)
				r = r[4+l:]
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("passed on %q, the chunks hold %q", out.Bytes(), want)
			}
		}
		var again, back bytes.Buffer
		if err := copyChunked(&again, bytes.NewReader(out.Bytes()), &n); err != nil {
			t.Fatal(err)
		}
		if err := copyUnchunked(&back, &again, &n); err != nil || !bytes.Equal(back.Bytes(), out.Bytes()) {
			t.Fatalf("round trip of %d bytes: %d bytes, %v", out.Len(), back.Len(), err)
		}
	})
}

// recordMsgs returns the frames WriteMsg puts on the wire for msgs, one
// input each, and all of them back to back.
func recordMsgs(f *testing.F, msgs []seedMsg) (each [][]byte, all []byte) {
	f.Helper()
	for _, m := range msgs {
		sc := &streamConn{r: bytes.NewReader(nil)}
		if err := NewConn(sc).WriteMsg(context.Background(), m.typ, m.v); err != nil {
			f.Fatal(err)
		}
		each = append(each, sc.out.Bytes())
		all = append(all, sc.out.Bytes()...)
	}
	return each, all
}

// seedMsgs are real messages: the greeting, a tunnel request, a message
// without a body and one whose body is a JSON string.
var seedMsgs = []seedMsg{
	{helloType, hello{Version: ProtocolVersion}},
	{MsgTunnel, TunnelRequest{Target: "127.0.0.1:7079", Token: "t0k3n"}},
	{"ping", nil},
	{"migration", "a string body"},
}

type seedMsg struct {
	typ string
	v   any
}

// FuzzReadMsg feeds a peer's arbitrary bytes to ReadMsg, the first read
// on every accepted connection: it fails cleanly or returns a typed
// message, and a message it returns, written again, reads back the same.
func FuzzReadMsg(f *testing.F) {
	each, all := recordMsgs(f, seedMsgs)
	for _, b := range each {
		f.Add(b)
	}
	f.Add(all)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := NewConn(&streamConn{r: bytes.NewReader(in)})
		for range 4 {
			typ, body, err := c.ReadMsg(context.Background())
			if err != nil {
				return
			}
			if typ == "" {
				t.Fatal("a message without a type")
			}
			var v any
			if body != nil {
				v = body
			}
			sc := &streamConn{r: bytes.NewReader(nil)}
			if err := NewConn(sc).WriteMsg(context.Background(), typ, v); err != nil {
				t.Fatalf("re-encode %q: %v", typ, err)
			}
			typ2, body2, err := NewConn(&streamConn{r: bytes.NewReader(sc.out.Bytes())}).ReadMsg(context.Background())
			if err != nil || typ2 != typ || !jsonEqual(body, body2) {
				t.Fatalf("re-read %q %s as %q %s (%v)", typ, body, typ2, body2, err)
			}
		}
	})
}

// FuzzEnvelope: any message frame payload decodes or fails cleanly, and
// what decodes encodes to a payload that decodes to the same message.
func FuzzEnvelope(f *testing.F) {
	each, _ := recordMsgs(f, seedMsgs)
	for _, b := range each {
		f.Add(b[headerLen:])
	}
	f.Add([]byte(`{"type":"x","body":null}`))
	f.Add([]byte(`{"type":""}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		typ, body, err := decodeEnvelope(in)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		var v any
		if body != nil {
			v = body
		}
		out, err := encodeEnvelope(typ, v)
		if err != nil {
			t.Fatalf("re-encode %q: %v", typ, err)
		}
		typ2, body2, err := decodeEnvelope(out)
		if err != nil || typ2 != typ || !jsonEqual(body, body2) {
			t.Fatalf("%q %s re-encoded as %s: %q %s (%v)", typ, body, out, typ2, body2, err)
		}
	})
}

// FuzzHello: the greeting check accepts exactly a greeting of this
// protocol version, whatever the peer sends, and what it accepts encodes
// back to a greeting it accepts.
func FuzzHello(f *testing.F) {
	each, _ := recordMsgs(f, []seedMsg{{helloType, hello{Version: ProtocolVersion, Node: "edge1"}}})
	typ, body, err := decodeEnvelope(each[0][headerLen:])
	if err != nil {
		f.Fatal(err)
	}
	f.Add(typ, []byte(body))
	f.Add(helloType, []byte(`{"version":1}`))
	f.Add(helloType, []byte(`{"version":2,"node":7}`))
	f.Add("ping", []byte(nil))
	f.Fuzz(func(t *testing.T, typ string, body []byte) {
		if err := checkHello(typ, body); err != nil {
			return
		}
		var h hello
		if typ != helloType || json.Unmarshal(body, &h) != nil || h.Version != ProtocolVersion {
			t.Fatalf("accepted %q %s", typ, body)
		}
		out, err := encodeEnvelope(helloType, h)
		if err != nil {
			t.Fatal(err)
		}
		typ2, body2, err := decodeEnvelope(out)
		if err != nil || checkHello(typ2, body2) != nil {
			t.Fatalf("greeting %+v re-encoded as %s: %v, %v", h, out, err, checkHello(typ2, body2))
		}
	})
}

// jsonEqual reports whether a and b are the same JSON value up to
// insignificant space (nil is no body).
func jsonEqual(a, b []byte) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

package lazyproxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// fixedConn is a net.Conn whose reads come from r and whose writes are
// kept.
type fixedConn struct {
	r   io.Reader
	out bytes.Buffer
}

func (c *fixedConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *fixedConn) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *fixedConn) Close() error                     { return nil }
func (c *fixedConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *fixedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *fixedConn) SetDeadline(time.Time) error      { return nil }
func (c *fixedConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fixedConn) SetWriteDeadline(time.Time) error { return nil }

type zeroPages struct{}

func (zeroPages) ReadPage(pid uint32, addr uint64, buf []byte) error {
	if addr%pageSize != 0 {
		return errors.New("unaligned")
	}
	clear(buf)
	return nil
}

// FuzzRelayDest plays the destination proxy between a lazy-pages daemon
// asking for 3 pages then closing, and a source proxy whose answers are
// the fuzzer's bytes: the relay fails cleanly or hands the daemon exactly
// what it asked for, never more pages than requested.
func FuzzRelayDest(f *testing.F) {
	get := header{cmd: cmdGet, nr: 3, vaddr: 0x7f0000000000, dstID: 42}
	closeReq := header{cmd: cmdClose}
	var daemon []byte
	daemon = get.appendTo(daemon)
	daemon = closeReq.appendTo(daemon)

	// A well-formed answer: one data page, one held, one data; then the
	// close status.
	var good []byte
	good = get.appendTo(good)
	good = append(good, pageData)
	good = append(good, bytes.Repeat([]byte{1}, pageSize)...)
	good = append(good, pageHeld)
	good = append(good, pageData)
	good = append(good, bytes.Repeat([]byte{2}, pageSize)...)
	good = append(good, 0, 0, 0, 0)
	f.Add(good)
	short := get
	short.nr = 1
	f.Add(append(append(short.appendTo(nil), pageHeld), 0, 0, 0, 0))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		down := &fixedConn{r: bytes.NewReader(daemon)}
		up := &fixedConn{r: bytes.NewReader(in)}
		var st Stats
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := relay(ctx, down, up, nil, func(h header, from *bufio.Reader, to *bufio.Writer) error {
			return decodePages(h, from, to, zeroPages{}, &st)
		})
		if ctx.Err() != nil {
			t.Fatal("relay hung")
		}
		if got := st.DataPages.Load() + st.HeldPages.Load(); got > int64(get.nr) {
			t.Fatalf("relayed %d pages for a request of %d", got, get.nr)
		}
		if err != nil {
			return
		}
		// The daemon got a reply header, that many pages and the status.
		out := down.out.Bytes()
		if len(out) < hdrSize {
			t.Fatalf("daemon got %d bytes", len(out))
		}
		var h header
		h.decode(out)
		if want := hdrSize + int(h.nr)*pageSize + 4; len(out) != want {
			t.Fatalf("daemon got %d bytes for a reply of %d pages, want %d", len(out), h.nr, want)
		}
	})
}

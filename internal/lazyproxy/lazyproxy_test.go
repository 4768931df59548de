package lazyproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// fakePageServer speaks the lazy side of CRIU's page-server protocol on l:
// it answers GET with min(asked, limit) pages of content(pid, addr), and
// CLOSE with status 0. It is the seam CRIU sits behind in production.
func fakePageServer(t *testing.T, l net.Listener, limit uint64) {
	t.Helper()
	servePages(l, func(h header) []byte {
		n := min(h.nr, limit)
		reply := encodeHeader(6|1<<16, n, h.vaddr, h.dstID)
		for i := uint64(0); i < n; i++ {
			reply = append(reply, content(uint32(h.dstID), h.vaddr+i*pageSize)...)
		}
		return reply
	}, nil)
}

// servePages runs a fake page server on l: get builds the reply to each
// GET (nil ends the connection, as CRIU does on a request it cannot
// serve); any other command is answered with status 0 and ends the
// connection, after onClose when given.
func servePages(l net.Listener, get func(header) []byte, onClose func()) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, hdrSize)
				for {
					if _, err := io.ReadFull(c, b); err != nil {
						return
					}
					var h header
					h.decode(b)
					if h.op() != cmdGet {
						if onClose != nil {
							onClose()
						}
						_, _ = c.Write([]byte{0, 0, 0, 0})
						return
					}
					reply := get(h)
					if reply == nil {
						return
					}
					if _, err := c.Write(reply); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func encodeHeader(cmd uint32, nr, vaddr, dst uint64) []byte {
	return header{cmd: cmd, nr: nr, vaddr: vaddr, dstID: dst}.appendTo(nil)
}

// content is the frozen page the fake page server serves.
func content(pid uint32, addr uint64) []byte {
	p := bytes.Repeat([]byte(fmt.Sprintf("%d:%x;", pid, addr)), pageSize)
	return p[:pageSize]
}

// store is the destination's copy: right for even pages, stale for odd
// ones (they changed after the last round).
type store struct{}

func held(addr uint64) bool { return addr/pageSize%2 == 0 }

func (store) ReadPage(pid uint32, addr uint64, buf []byte) error {
	if !held(addr) {
		return errors.New("read a page the source did not vouch for")
	}
	copy(buf, content(pid, addr))
	return nil
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// chain starts fake CRIU ← ServeSource ← ServeDest and returns
// ServeDest's address and both proxies' stats.
func chain(t *testing.T, limit uint64) (string, *Stats, *Stats) {
	t.Helper()
	return chainWith(t, func(l net.Listener) { fakePageServer(t, l, limit) },
		func(ctx context.Context, l net.Listener, up func(context.Context) (net.Conn, error), st *Stats) error {
			return ServeDest(ctx, l, up, store{}, st, nil)
		})
}

// chainWith starts the page server criu on a listener, ServeSource in
// front of it and dest in front of that, and returns dest's address and
// both proxies' stats.
func chainWith(t *testing.T, criu func(net.Listener), dest func(context.Context, net.Listener, func(context.Context) (net.Conn, error), *Stats) error) (string, *Stats, *Stats) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cl, src, dst := listen(t), listen(t), listen(t)
	criu(cl)
	var sst, dstat Stats
	holds := func(pid uint32, addr uint64, page []byte) bool {
		return held(addr) && bytes.Equal(page, content(pid, addr))
	}
	done := make(chan struct{}, 2)
	go func() { _ = ServeSource(ctx, src, cl.Addr().String(), holds, &sst, nil); done <- struct{}{} }()
	up := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", src.Addr().String())
	}
	go func() { _ = dest(ctx, dst, up, &dstat); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		<-done
		<-done
	})
	return dst.Addr().String(), &sst, &dstat
}

// TestRelayRebuildsReplies: pipelined GETs through both proxies come back
// exactly as CRIU sent them, held pages never cross, and CLOSE's status
// comes through.
func TestRelayRebuildsReplies(t *testing.T) {
	addr, sst, dstat := chain(t, 1<<20)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	reqs := []struct {
		pid      uint32
		vaddr, n uint64
	}{{7, 0x400000, 1}, {7, 0x7f0000000000, 16}, {9, 0x1000, 5}}
	for _, r := range reqs { // all sent before any reply is read
		if _, err := c.Write(encodeHeader(cmdGet, r.n, r.vaddr, uint64(r.pid))); err != nil {
			t.Fatal(err)
		}
	}
	var total, wantHeld uint64
	for _, r := range reqs {
		b := make([]byte, hdrSize)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		var h header
		h.decode(b)
		if h.nr != r.n || h.vaddr != r.vaddr || h.dstID != uint64(r.pid) {
			t.Fatalf("reply %+v to request %+v", h, r)
		}
		for i := uint64(0); i < r.n; i++ {
			page := make([]byte, pageSize)
			if _, err := io.ReadFull(c, page); err != nil {
				t.Fatal(err)
			}
			a := r.vaddr + i*pageSize
			if !bytes.Equal(page, content(r.pid, a)) {
				t.Fatalf("page %#x of %d differs", a, r.pid)
			}
			if held(a) {
				wantHeld++
			}
			total++
		}
	}
	if _, err := c.Write(encodeHeader(cmdClose, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, 4)
	if _, err := io.ReadFull(c, status); err != nil || binary.LittleEndian.Uint32(status) != 0 {
		t.Fatalf("close status %v, %v", status, err)
	}
	for _, st := range []*Stats{sst, dstat} {
		if st.HeldPages.Load() != int64(wantHeld) || st.DataPages.Load() != int64(total-wantHeld) || st.Requests.Load() != int64(len(reqs)) {
			t.Errorf("stats held %d data %d requests %d, want %d %d %d", st.HeldPages.Load(), st.DataPages.Load(), st.Requests.Load(), wantHeld, total-wantHeld, len(reqs))
		}
	}
}

// TestShortReply: CRIU may answer with fewer pages than asked; the proxies
// pass the shorter reply on intact.
func TestShortReply(t *testing.T) {
	addr, _, _ := chain(t, 3)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeHeader(cmdGet, 8, 0x10000, 3)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, hdrSize+3*pageSize)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	var h header
	h.decode(b)
	if h.nr != 3 || !bytes.Equal(b[hdrSize+2*pageSize:], content(3, 0x12000)) {
		t.Fatalf("short reply %+v or its last page wrong", h)
	}
}

// TestUnknownCommand: a command the proxies do not know ends the
// connection instead of being guessed at.
func TestUnknownCommand(t *testing.T) {
	addr, _, _ := chain(t, 1<<20)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeHeader(2 /* PS_IOV_HOLE */, 1, 0, 1)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes after an unknown command, want the connection closed", n)
	}
}

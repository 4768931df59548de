package lazyproxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/edgehop/edgehop/internal/linux"
)

// CRIU's page-server protocol (criu/page-xfer.c, CRIU 4.x): every
// request is a struct page_server_iov {u32 cmd; u64 nr_pages; u64 vaddr;
// u64 dst_id;} (32 bytes, little-endian, 4 bytes of padding after cmd).
// The lazy-pages daemon sends only GET (dst_id is the process's pid in its
// namespace) and, at the end, CLOSE or FORCE_CLOSE. The server answers a
// GET with a header (cmd ADD_F, nr_pages possibly fewer than asked) and
// that many pages, in request order; a CLOSE with an int32 status.
const (
	hdrSize  = 32
	pageSize = 4096

	cmdGet        = 7
	cmdClose      = 0x1023
	cmdForceClose = 0x1024
	cmdMask       = 1<<16 - 1

	// maxPages bounds one reply: the daemon asks for at most 4 MiB.
	maxPages = 4 << 20 / pageSize
)

// Page flags on the proxies' own link, one byte before each page.
const (
	pageData byte = 0 // 4096 bytes follow
	pageHeld byte = 1 // the destination holds this content at this address
)

type header struct {
	cmd              uint32
	nr, vaddr, dstID uint64
}

func (h *header) decode(b []byte) {
	h.cmd = binary.LittleEndian.Uint32(b[0:])
	h.nr = binary.LittleEndian.Uint64(b[8:])
	h.vaddr = binary.LittleEndian.Uint64(b[16:])
	h.dstID = binary.LittleEndian.Uint64(b[24:])
}

// appendTo appends h's wire form to b.
func (h header) appendTo(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, h.cmd)
	b = binary.LittleEndian.AppendUint32(b, 0) // padding
	b = binary.LittleEndian.AppendUint64(b, h.nr)
	b = binary.LittleEndian.AppendUint64(b, h.vaddr)
	return binary.LittleEndian.AppendUint64(b, h.dstID)
}

func (h header) op() uint32 { return h.cmd & cmdMask }

// Stats counts the pages a proxy moved.
type Stats struct {
	Requests   atomic.Int64
	HeldPages  atomic.Int64 // answered from the destination's copy
	DataPages  atomic.Int64 // sent over the network
	Prefetched atomic.Int64 // given to the daemon from pages pulled ahead of it
}

// Holds says whether the destination holds page (its content) at addr of
// process pid.
type Holds func(pid uint32, addr uint64, page []byte) bool

// PageReader reads a page the destination holds.
type PageReader interface {
	ReadPage(pid uint32, addr uint64, buf []byte) error
}

// ServeSource accepts connections on l (they come from the destination's
// proxy through the agents' tunnel) until ctx ends or l is closed. Each
// is paired with a new connection to CRIU's page server at criuAddr:
// requests go to CRIU unchanged; each page of CRIU's replies goes on as
// "held" when holds says the destination has it, else as data.
func ServeSource(ctx context.Context, l net.Listener, criuAddr string, holds Holds, st *Stats, log *slog.Logger) error {
	return serve(ctx, l, log, func(ctx context.Context, down net.Conn) error {
		// Should this process die before a CLOSE went up, the kernel
		// resets the connection rather than ending it, which CRIU would
		// take for a finished session (pageServerConn.end).
		up, err := linux.DialAbortive(ctx, criuAddr)
		if err != nil {
			return fmt.Errorf("page server %s: %w", criuAddr, err)
		}
		return relay(ctx, down, up, nil, func(h header, from *bufio.Reader, to *bufio.Writer) error {
			st.Requests.Add(1)
			return encodePages(h, from, to, holds, st)
		})
	})
}

// ServeDest accepts the lazy-pages daemon's connections on l until ctx
// ends or l is closed. Each is paired with a connection from upstream
// (to ServeSource): requests go on unchanged; replies are rebuilt into
// CRIU's form, "held" pages read from pages.
func ServeDest(ctx context.Context, l net.Listener, upstream func(context.Context) (net.Conn, error), pages PageReader, st *Stats, log *slog.Logger) error {
	return PrefetchConfig{}.ServeDest(ctx, l, upstream, pages, st, log)
}

// ServeDest is the package's ServeDest holding the daemon's CLOSE until
// pc.Release (MaxPages does not apply: it only relays).
func (pc PrefetchConfig) ServeDest(ctx context.Context, l net.Listener, upstream func(context.Context) (net.Conn, error), pages PageReader, st *Stats, log *slog.Logger) error {
	return serve(ctx, l, log, func(ctx context.Context, down net.Conn) error {
		up, err := upstream(ctx)
		if err != nil {
			return fmt.Errorf("source proxy: %w", err)
		}
		return relay(ctx, down, up, pc.Release, func(h header, from *bufio.Reader, to *bufio.Writer) error {
			st.Requests.Add(1)
			return decodePages(h, from, to, pages, st)
		})
	})
}

func serve(ctx context.Context, l net.Listener, log *slog.Logger, handle func(context.Context, net.Conn) error) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			if err := handle(ctx, c); err != nil && ctx.Err() == nil {
				log.Warn("lazy page proxy", "err", err)
			}
		}()
	}
}

// relay forwards requests from down to up and up's replies back to down,
// each reply to a GET transformed by pages. Replies come in request order,
// so the reply side learns from a queue which request each answers. A
// CLOSE goes up only once release is closed (nil: at once).
func relay(ctx context.Context, down, up net.Conn, release <-chan struct{}, pages func(h header, from *bufio.Reader, to *bufio.Writer) error) error {
	ps := &pageServerConn{Conn: up}
	defer ps.end()
	stop := context.AfterFunc(ctx, func() { down.Close(); ps.end() })
	defer stop()
	pending := make(chan header, 1024)
	reqErr := make(chan error, 1)
	go func() {
		defer close(pending)
		r := bufio.NewReader(down)
		b := make([]byte, hdrSize)
		for {
			if _, err := io.ReadFull(r, b); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				reqErr <- err
				return
			}
			var h header
			h.decode(b)
			switch h.op() {
			case cmdGet:
				if h.nr == 0 || h.nr > maxPages {
					reqErr <- fmt.Errorf("request for %d pages", h.nr)
					return
				}
			case cmdClose, cmdForceClose:
				if release != nil {
					select {
					case <-release:
					case <-ctx.Done():
						reqErr <- ctx.Err()
						return
					}
				}
			default:
				reqErr <- fmt.Errorf("unknown page-server command %#x", h.cmd)
				return
			}
			if _, err := up.Write(b); err != nil {
				reqErr <- err
				return
			}
			pending <- h
			if h.op() != cmdGet {
				ps.sentClose()
				halfClose(up)
				reqErr <- nil
				return
			}
		}
	}()
	from := bufio.NewReaderSize(up, 1<<20)
	to := bufio.NewWriterSize(down, 1<<20)
	for req := range pending {
		if req.op() != cmdGet {
			var status [4]byte
			if _, err := io.ReadFull(from, status[:]); err != nil {
				return fmt.Errorf("close status: %w", err)
			}
			if _, err := to.Write(status[:]); err != nil {
				return err
			}
			return to.Flush()
		}
		b := make([]byte, hdrSize)
		if _, err := io.ReadFull(from, b); err != nil {
			return fmt.Errorf("reply to GET %#x+%d of %d: %w", req.vaddr, req.nr, req.dstID, err)
		}
		var h header
		h.decode(b)
		if h.nr > req.nr || h.vaddr != req.vaddr || h.dstID != req.dstID {
			return fmt.Errorf("reply %+v does not answer request %+v", h, req)
		}
		if _, err := to.Write(b); err != nil {
			return err
		}
		if err := pages(h, from, to); err != nil {
			return err
		}
		if len(pending) == 0 {
			if err := to.Flush(); err != nil {
				return err
			}
		}
	}
	if err := to.Flush(); err != nil {
		return err
	}
	return <-reqErr
}

// pageServerConn is a connection to CRIU's page server. CRIU takes end
// of file before a CLOSE for the end of a successful session: a lazy dump
// then kills the dumped tasks, and the source could no longer resume the
// service when the destination failed. So the connection ends with end of
// file only once a CLOSE went up it, and with a reset before (or any
// error), which makes the dump fail and CRIU resume the tasks.
type pageServerConn struct {
	net.Conn
	closeSent atomic.Bool
}

// sentClose records that a CLOSE went up the connection.
func (c *pageServerConn) sentClose() { c.closeSent.Store(true) }

// end closes the connection: cleanly after a CLOSE, with a reset (where
// it is TCP) before.
func (c *pageServerConn) end() {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		if c.closeSent.Load() {
			_ = tc.SetLinger(-1)
		} else {
			_ = tc.SetLinger(0)
		}
	}
	_ = c.Conn.Close()
}

// halfClose ends c's sending side after a CLOSE. CRIU's lazy page server
// corks its socket: its 4-byte answer to CLOSE waits up to 200 ms in the
// kernel, and only then does the daemon close, which the server waits for
// before its dump can end. Seeing end of file right away, the server
// closes at once, which sends the answer too (measured: the source was
// free about 0.4 s later without this).
func halfClose(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// encodePages reads h.nr pages from CRIU and writes each flagged.
func encodePages(h header, from *bufio.Reader, to *bufio.Writer, holds Holds, st *Stats) error {
	page := make([]byte, pageSize)
	for i := uint64(0); i < h.nr; i++ {
		if _, err := io.ReadFull(from, page); err != nil {
			return fmt.Errorf("page data: %w", err)
		}
		if holds(uint32(h.dstID), h.vaddr+i*pageSize, page) {
			st.HeldPages.Add(1)
			if err := to.WriteByte(pageHeld); err != nil {
				return err
			}
			continue
		}
		st.DataPages.Add(1)
		if err := to.WriteByte(pageData); err != nil {
			return err
		}
		if _, err := to.Write(page); err != nil {
			return err
		}
	}
	return nil
}

// decodePages reads h.nr flagged pages and writes CRIU's plain pages.
func decodePages(h header, from *bufio.Reader, to *bufio.Writer, pages PageReader, st *Stats) error {
	page := make([]byte, pageSize)
	for i := uint64(0); i < h.nr; i++ {
		flag, err := from.ReadByte()
		if err != nil {
			return fmt.Errorf("page flag: %w", err)
		}
		switch flag {
		case pageData:
			st.DataPages.Add(1)
			if _, err := io.ReadFull(from, page); err != nil {
				return fmt.Errorf("page data: %w", err)
			}
		case pageHeld:
			st.HeldPages.Add(1)
			if err := pages.ReadPage(uint32(h.dstID), h.vaddr+i*pageSize, page); err != nil {
				return fmt.Errorf("held page %#x of %d: %w", h.vaddr+i*pageSize, h.dstID, err)
			}
		default:
			return fmt.Errorf("page flag %d", flag)
		}
		if _, err := to.Write(page); err != nil {
			return err
		}
	}
	return nil
}

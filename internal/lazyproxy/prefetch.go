package lazyproxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Range is a run of lazy pages of one process (pid in its namespace, as
// the lazy-pages daemon names it in dst_id), as the dump's pagemaps list
// them.
type Range struct {
	PID   uint32
	Addr  uint64
	Pages uint64
}

// Limits of a prefetch: how many pages one request asks for, how many
// prefetched bytes may be on their way, and how many may wait in the
// cache for the daemon.
const (
	prefetchReqPages = 256 // 1 MiB
	prefetchInFlight = 16 << 20
	// While the daemon faults, the prefetch keeps less in flight: a
	// fault's request queues behind what is in flight (16 MiB is 130 ms
	// at 1 Gbit/s, a fault's round trip is a few ms), and the service
	// waits for each fault in turn. It goes back to the full amount (a
	// link with a large bandwidth-delay product needs it) once no fault
	// came for faultQuiet.
	prefetchInFlightFaulting = 2 << 20
	faultQuiet               = 100 * time.Millisecond
	prefetchCached           = 256 << 20
	// After the daemon faults a page that was not on its way, the
	// followBelow pages below it, then the followPages above it, are
	// prefetched first.
	followPages = 2 * prefetchReqPages
	followBelow = 16
)

// replyCmd is CRIU's header command of a GET reply:
// encode_ps_cmd(PS_IOV_ADD_F, PE_PRESENT).
const replyCmd = 4<<16 | 6

// ServePrefetch connects upstream at once and accepts the lazy-pages
// daemon's connection on l until ctx ends or l is closed.
// With held nil (post-copy) upstream is CRIU's page server, through the
// agents' tunnel; otherwise (hybrid) it is ServeSource, whose replies flag
// the pages the destination holds, read from held. Besides relaying the
// daemon's requests, it asks for every page of ranges, back to back, from
// the start (the dump is done and the state has arrived: CRIU's restore is
// about to begin), and answers the daemon from those pages when it has
// them.
//
// The daemon alone asks for one run of pages at a time and waits for each
// reply (a round trip through the tunnel per run, 6-10 ms here), and the
// pages it fetches in the background ramp up from 64 KiB again after every
// fault: a 700 KB service took 0.7 s to arrive whole, a 100 MB one 2.4 to
// 9 s. Asked ahead, the pages cross the link at its rate.
//
// The page server must only be asked for pages it holds as lazy (it gives
// up on a request for none), so ranges must come from the same dump's
// pagemaps (PE_LAZY entries); a reply with fewer pages than asked ends the
// run of pages the server keeps together, and the rest is asked again.
//
// The ranges come from the source's pagemaps: ServePrefetch refuses (an
// ErrBadRuns, and l closed) runs that overlap, are unaligned, end past
// the address space or hold more than DefaultMaxLazyPages in all; see
// PrefetchConfig for another limit.
func ServePrefetch(ctx context.Context, l net.Listener, upstream func(context.Context) (net.Conn, error), held PageReader, ranges []Range, st *Stats, log *slog.Logger) error {
	return PrefetchConfig{}.ServePrefetch(ctx, l, upstream, held, ranges, st, log)
}

// PrefetchConfig holds the settings of ServePrefetch. The zero value uses
// the defaults.
type PrefetchConfig struct {
	// MaxPages bounds the lazy pages the ranges may hold in all: the
	// service's declared memory divided by the page size (4096). Zero
	// means DefaultMaxLazyPages.
	MaxPages uint64
	// Release, when set, holds every CLOSE for the page server (the
	// proxy's own, once the daemon has every lazy page, and the
	// daemon's) until it is closed. CRIU's lazy dump takes a session that
	// ends with a CLOSE for a migration that succeeded and kills the
	// dumped tasks: before the migration's commit the source must still
	// be able to resume them, so the destination closes Release only
	// once the commit is in its journal. The pages still cross at once;
	// only the session's end waits. Nil: no hold.
	Release <-chan struct{}
}

// ServePrefetch is the package's ServePrefetch with pc's settings.
func (pc PrefetchConfig) ServePrefetch(ctx context.Context, l net.Listener, upstream func(context.Context) (net.Conn, error), held PageReader, ranges []Range, st *Stats, log *slog.Logger) error {
	if pc.MaxPages == 0 {
		pc.MaxPages = DefaultMaxLazyPages
	}
	todo, err := planRanges(ranges, pc.MaxPages)
	if err != nil {
		l.Close() // the daemon fails at once rather than waiting
		return err
	}
	decode := plainPages(st)
	if held != nil {
		decode = flaggedPages(held, st)
	}
	// The pages cross while CRIU restores, not from the restored
	// service's first fault on: a small service's lazy pages are all
	// here when it first runs.
	up, err := upstream(ctx)
	if err != nil {
		l.Close() // the daemon fails at once rather than waiting
		return fmt.Errorf("page server: %w", err)
	}
	m := newMux(up, todo, st, decode)
	if pc.Release != nil {
		m.release = pc.Release
	}
	stop := context.AfterFunc(ctx, func() { m.fail(ctx.Err()) })
	defer stop()
	m.wg.Go(m.readReplies)
	m.wg.Go(m.prefetch)
	m.wg.Go(m.closeOnRelease)
	var connected atomic.Bool
	err = serve(ctx, l, log, func(_ context.Context, down net.Conn) error {
		if connected.Swap(true) {
			return errors.New("a second lazy-pages daemon connection (the page server serves one)")
		}
		return m.run(down)
	})
	m.fail(errDone) // a daemon that never came
	m.wg.Wait()
	return err
}

// A pageDecoder reads the pages of a reply whose header is h.
type pageDecoder func(h header, from *bufio.Reader) ([]byte, error)

// plainPages reads CRIU's own replies: h.nr pages.
func plainPages(st *Stats) pageDecoder {
	return func(h header, from *bufio.Reader) ([]byte, error) {
		data := make([]byte, h.nr*pageSize)
		if _, err := io.ReadFull(from, data); err != nil {
			return nil, fmt.Errorf("page data: %w", err)
		}
		st.DataPages.Add(int64(h.nr))
		return data, nil
	}
}

// flaggedPages reads ServeSource's replies (decodePages).
func flaggedPages(pages PageReader, st *Stats) pageDecoder {
	return func(h header, from *bufio.Reader) ([]byte, error) {
		var b bytes.Buffer
		b.Grow(int(h.nr * pageSize))
		w := bufio.NewWriterSize(&b, pageSize)
		if err := decodePages(h, from, w, pages, st); err != nil {
			return nil, err
		}
		if err := w.Flush(); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
}

type pageKey struct {
	pid  uint32
	addr uint64
}

// A slot is one answer the daemon waits for, in request order.
type slot struct {
	reply []byte // header and pages, or a close status
	ready chan struct{}
}

// An upstream request and who gets its reply.
type upReq struct {
	h        header
	prefetch bool
	early    bool  // the proxy's own CLOSE
	daemon   *slot // when neither
}

// A parkedReq is a daemon request waiting for prefetched pages.
type parkedReq struct {
	h header
	s *slot
}

type mux struct {
	down   net.Conn
	up     *pageServerConn
	st     *Stats
	decode pageDecoder

	mu       sync.Mutex
	cond     *sync.Cond
	cache    map[pageKey][]byte
	cached   int64          // bytes in cache
	inFlight int64          // prefetched bytes asked for and not yet read
	closed   bool           // the daemon sent CLOSE: no more requests upstream
	started  bool           // the daemon made its first request
	wg       sync.WaitGroup // readReplies and prefetch
	// lastFault is when the daemon last asked for a page it lacks (one
	// page per request: its runs in the background are longer) that was
	// not in the cache; quietTimer wakes the prefetch when faultQuiet
	// has passed since.
	lastFault  time.Time
	quietTimer *time.Timer
	failed     error
	todo       []Range // prefetch work left, in address order
	// follow is prefetch work asked before todo: the pages around the
	// daemon's latest faults, the latest first.
	follow  []Range
	pending []upReq // upstream requests awaiting their reply, in order
	// owed are the lazy pages the daemon has not been given yet. Once it
	// has them all, the proxy closes the page server's session itself:
	// the daemon's own CLOSE leaves corked (CRIU's disconnect sends it
	// without a push) and reaches the server only after the kernel's
	// 200 ms cork timeout, keeping the source busy that much longer.
	// Runs, not pages: the source's pagemaps say how many there are.
	owed *pageSet
	// wanted are the lazy pages nobody has asked the server for yet:
	// the prefetch skips pages the daemon asked for itself, which would
	// otherwise cross twice and then sit in the cache for good.
	wanted *pageSet
	// inflight are the pages the prefetch asked for and has not read yet
	// (at most prefetchInFlight bytes of them); a daemon request whose
	// first page is in flight is parked until it is in, rather than
	// asked for again behind it.
	inflight    map[pageKey]struct{}
	parked      []parkedReq
	earlyClosed bool   // the proxy sent CLOSE on the daemon's behalf
	earlyStatus []byte // the server's answer to it, once read
	earlyReady  chan struct{}
	// closeDue: the daemon has every lazy page, and the proxy's CLOSE
	// waits for release (PrefetchConfig.Release; closed when not held).
	closeDue bool
	release  <-chan struct{}
	failCh   chan struct{} // closed by the first fail
	failOnce sync.Once

	slots chan *slot
}

// newMux prefetches todo, ranges as planRanges returns them (in order).
func newMux(up net.Conn, todo []Range, st *Stats, decode pageDecoder) *mux {
	m := &mux{up: &pageServerConn{Conn: up}, st: st, decode: decode, cache: map[pageKey][]byte{}, todo: todo,
		slots: make(chan *slot, 4096), owed: newPageSet(todo), inflight: map[pageKey]struct{}{}, earlyReady: make(chan struct{}),
		failCh: make(chan struct{})}
	released := make(chan struct{})
	close(released)
	m.release = released
	m.wanted = m.owed.clone()
	m.cond = sync.NewCond(&m.mu)
	return m
}

func (m *mux) fail(err error) {
	m.mu.Lock()
	if m.failed == nil {
		m.failed = err
	}
	down := m.down
	m.cond.Broadcast()
	m.mu.Unlock()
	m.failOnce.Do(func() { close(m.failCh) })
	m.up.end() // a reset before a CLOSE: the source must be able to resume
	if down != nil {
		down.Close()
	}
}

// send writes h upstream and queues who gets the reply, atomically, so
// the queue's order is the wire's. The caller holds m.mu.
func (m *mux) sendLocked(r upReq) error {
	if _, err := m.up.Write(r.h.appendTo(make([]byte, 0, hdrSize))); err != nil {
		return err
	}
	if r.h.op() != cmdGet {
		m.up.sentClose()
	}
	m.pending = append(m.pending, r)
	m.cond.Broadcast()
	return nil
}

// run serves the daemon on down until its CLOSE is answered or the
// connection fails.
func (m *mux) run(down net.Conn) error {
	m.mu.Lock()
	m.down = down
	failed := m.failed
	m.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("page server: %w", failed)
	}
	var wg sync.WaitGroup
	wg.Go(m.writeDaemon)
	err := m.readDaemon()
	m.mu.Lock()
	sentClose := m.closed
	m.closed = true // no more requests upstream
	m.cond.Broadcast()
	m.mu.Unlock()
	if err != nil || !sentClose {
		// Without a CLOSE nothing will answer what is pending.
		m.fail(cmp.Or(err, errDone))
	}
	close(m.slots)
	wg.Wait()
	m.wg.Wait()
	m.fail(errDone) // closes upstream: cleanly only after a CLOSE
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil && m.failed != nil && !errors.Is(m.failed, errDone) {
		err = m.failed
	}
	return err
}

// errDone ends the helpers once the daemon's CLOSE was answered.
var errDone = errors.New("lazy pages done")

// readDaemon reads the daemon's requests until its CLOSE.
func (m *mux) readDaemon() error {
	r := bufio.NewReader(m.down)
	b := make([]byte, hdrSize)
	for {
		if _, err := io.ReadFull(r, b); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		var h header
		h.decode(b)
		s := &slot{ready: make(chan struct{})}
		switch h.op() {
		case cmdGet:
			if h.nr == 0 || h.nr > maxPages {
				return fmt.Errorf("request for %d pages", h.nr)
			}
			m.slots <- s
			m.mu.Lock()
			if !m.started {
				m.started = true
				m.lastFault = time.Now() // the service starts faulting now
			}
			if reply, ok := m.takeCachedLocked(h); ok {
				m.mu.Unlock()
				m.st.Requests.Add(1)
				s.reply = reply
				close(s.ready)
				continue
			}
			if h.nr == 1 {
				m.lastFault = time.Now()
			}
			if m.comingLocked(h) {
				m.parked = append(m.parked, parkedReq{h, s})
				m.mu.Unlock()
				continue
			}
			err := m.forwardLocked(h, s)
			m.mu.Unlock()
			if err != nil {
				close(s.ready)
				return err
			}
		case cmdClose, cmdForceClose:
			m.slots <- s
			// The session ends only once released (PrefetchConfig.Release).
			select {
			case <-m.release:
			case <-m.failCh:
			}
			m.mu.Lock()
			if m.failed != nil && !m.earlyClosed {
				err := m.failed
				m.mu.Unlock()
				close(s.ready)
				return err
			}
			if m.earlyClosed {
				m.closed = true
				m.mu.Unlock()
				go func() { // answered with the server's own status
					<-m.earlyReady
					s.reply = m.earlyStatus
					close(s.ready)
				}()
				return nil
			}
			err := m.sendLocked(upReq{h: h, daemon: s})
			m.closed = err == nil
			m.mu.Unlock()
			if err != nil {
				close(s.ready)
				return err
			}
			halfClose(m.up.Conn)
			return nil
		default:
			return fmt.Errorf("unknown page-server command %#x", h.cmd)
		}
	}
}

// takeCachedLocked builds the reply to h from the leading pages of it the
// cache holds (none: false), and drops those pages from the cache.
func (m *mux) takeCachedLocked(h header) ([]byte, bool) {
	pid := uint32(h.dstID)
	n := uint64(0)
	for n < h.nr {
		if _, ok := m.cache[pageKey{pid, h.vaddr + n*pageSize}]; !ok {
			break
		}
		n++
	}
	if n == 0 {
		return nil, false
	}
	h.nr = n // a short reply, as CRIU's server gives at a run's end: the daemon asks for the rest
	h.cmd = replyCmd
	reply := h.appendTo(make([]byte, 0, hdrSize+h.nr*pageSize))
	for i := uint64(0); i < h.nr; i++ {
		k := pageKey{pid, h.vaddr + i*pageSize}
		reply = append(reply, m.cache[k]...)
		delete(m.cache, k)
	}
	m.cached -= int64(h.nr * pageSize)
	m.st.Prefetched.Add(int64(h.nr))
	m.deliveredLocked(h.dstID, h.vaddr, h.nr)
	m.cond.Broadcast()
	return reply, true
}

// deliveredLocked records that the daemon was given nr pages from vaddr of
// pid, and closes the session early once it has every lazy page.
func (m *mux) deliveredLocked(pid, vaddr, nr uint64) {
	if m.owed.empty() {
		return
	}
	m.owed.remove(uint32(pid), vaddr, nr)
	if !m.owed.empty() {
		return
	}
	m.closeDue = true
	select {
	case <-m.release:
		m.earlyCloseLocked()
	default: // closeOnRelease sends it
	}
}

// earlyCloseLocked sends the proxy's own CLOSE once the daemon has every
// lazy page, unless a CLOSE went already or the session failed.
func (m *mux) earlyCloseLocked() {
	if !m.closeDue || m.closed || m.earlyClosed || m.failed != nil {
		return
	}
	if err := m.sendLocked(upReq{h: header{cmd: cmdClose}, early: true}); err != nil {
		return // the daemon's own CLOSE will try again
	}
	m.earlyClosed = true
	halfClose(m.up.Conn)
}

// closeOnRelease sends the proxy's CLOSE held back for release
// (deliveredLocked) once it comes, and ends when the session fails.
func (m *mux) closeOnRelease() {
	select {
	case <-m.release:
	case <-m.failCh:
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.earlyCloseLocked()
}

// writeDaemon writes the answers in request order.
func (m *mux) writeDaemon() {
	w := bufio.NewWriterSize(m.down, 1<<20)
	for s := range m.slots {
		<-s.ready
		if s.reply == nil {
			return // failed
		}
		if _, err := w.Write(s.reply); err != nil {
			m.fail(err)
			return
		}
		if len(m.slots) == 0 {
			if err := w.Flush(); err != nil {
				m.fail(err)
				return
			}
		}
	}
	_ = w.Flush()
}

// prefetch asks for the ranges' pages, a request at a time, while the
// bytes in flight and in the cache stay within their limits, until
// everything was asked or the daemon closed.
func (m *mux) prefetch() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		// Wait for room or for work: a short reply still in flight may
		// add the rest of its run.
		for m.failed == nil && !m.closed && (m.inFlight >= m.inFlightLimitLocked() || m.cached >= prefetchCached ||
			(len(m.todo)+len(m.follow) == 0 && m.inFlight > 0)) {
			m.cond.Wait()
		}
		if m.failed != nil || m.closed || len(m.todo)+len(m.follow) == 0 {
			return
		}
		queue := &m.todo
		if len(m.follow) > 0 {
			queue = &m.follow
		}
		r := &(*queue)[0]
		if wanted, n := m.wanted.span(r.PID, r.Addr, r.Pages); !wanted { // the daemon asked for them
			r.Addr += n * pageSize
			r.Pages -= n
		}
		if r.Pages == 0 {
			*queue = (*queue)[1:]
			continue
		}
		_, n := m.wanted.span(r.PID, r.Addr, min(r.Pages, prefetchReqPages))
		h := header{cmd: cmdGet, nr: n, vaddr: r.Addr, dstID: uint64(r.PID)}
		if r.Pages == n {
			*queue = (*queue)[1:]
		} else {
			r.Addr += n * pageSize
			r.Pages -= n
		}
		m.wanted.remove(r.PID, h.vaddr, n)
		for i := uint64(0); i < n; i++ {
			m.inflight[pageKey{uint32(h.dstID), h.vaddr + i*pageSize}] = struct{}{}
		}
		m.inFlight += int64(n * pageSize)
		if err := m.sendLocked(upReq{h: h, prefetch: true}); err != nil {
			m.failed = err
			m.cond.Broadcast()
			return
		}
	}
}

// inFlightLimitLocked is how many prefetched bytes may be on their way
// now: less while the daemon faults. When the smaller limit holds the
// prefetch back, a timer wakes it once the faults have been quiet long
// enough for the larger one.
func (m *mux) inFlightLimitLocked() int64 {
	if !m.started {
		// CRIU is restoring: as little as while the service faults, so
		// that its first faults do not queue behind the full amount.
		return prefetchInFlightFaulting
	}
	quiet := time.Since(m.lastFault)
	if quiet >= faultQuiet {
		return prefetchInFlight
	}
	if m.inFlight >= prefetchInFlightFaulting && m.quietTimer == nil {
		m.quietTimer = time.AfterFunc(faultQuiet-quiet, func() {
			m.mu.Lock()
			m.quietTimer = nil
			m.cond.Broadcast()
			m.mu.Unlock()
		})
	}
	return prefetchInFlightFaulting
}

// comingLocked says whether the first page of h is on its way to the
// cache.
func (m *mux) comingLocked(h header) bool {
	_, ok := m.inflight[pageKey{uint32(h.dstID), h.vaddr}]
	return ok
}

// forwardLocked asks the server, on the daemon's behalf, for the leading
// pages of h that are neither cached nor on their way; the daemon gets a
// short reply and asks for the rest.
func (m *mux) forwardLocked(h header, s *slot) error {
	n := uint64(1)
	for n < h.nr {
		k := pageKey{uint32(h.dstID), h.vaddr + n*pageSize}
		_, cached := m.cache[k]
		_, coming := m.inflight[k]
		if cached || coming {
			break
		}
		n++
	}
	h.nr = n
	m.wanted.remove(uint32(h.dstID), h.vaddr, n)
	// Faults come in runs (a service walking a table, a stack growing):
	// the prefetch goes on from here first, so the next fault finds its
	// page on the way instead of waiting again behind the prefetch.
	// A stack grows down: a few pages below come first.
	below := min(h.vaddr/pageSize, followBelow)
	m.follow = slices.Insert(m.follow, 0, Range{PID: uint32(h.dstID), Addr: h.vaddr - below*pageSize, Pages: below},
		Range{PID: uint32(h.dstID), Addr: h.vaddr + n*pageSize, Pages: followPages})
	return m.sendLocked(upReq{h: h, daemon: s})
}

// serveParkedLocked answers the parked requests whose first pages are in
// now, and forwards those whose first page is no longer coming.
func (m *mux) serveParkedLocked() error {
	kept := m.parked[:0]
	for _, p := range m.parked {
		if reply, ok := m.takeCachedLocked(p.h); ok {
			m.st.Requests.Add(1)
			p.s.reply = reply
			close(p.s.ready)
			continue
		}
		if !m.comingLocked(p.h) {
			if err := m.forwardLocked(p.h, p.s); err != nil {
				return err
			}
			continue
		}
		kept = append(kept, p)
	}
	m.parked = kept
	return nil
}

// readReplies reads the page server's replies in request order and hands
// each to its owner: the cache or the daemon's slot. Whatever ends it, no
// daemon slot is left waiting.
func (m *mux) readReplies() {
	defer m.releaseSlots()
	if err := m.readRepliesUntilClose(); err != nil {
		m.fail(err)
	}
}

// readRepliesUntilClose reads replies until the answer to a CLOSE (nil) or
// a failure, its own (returned) or another goroutine's (nil).
func (m *mux) readRepliesUntilClose() error {
	from := bufio.NewReaderSize(m.up, 1<<20)
	for {
		m.mu.Lock()
		for len(m.pending) == 0 && m.failed == nil {
			m.cond.Wait()
		}
		if m.failed != nil {
			m.mu.Unlock()
			return nil
		}
		req := m.pending[0]
		m.pending = m.pending[1:]
		m.mu.Unlock()

		if req.h.op() != cmdGet { // CLOSE: a status
			status := make([]byte, 4)
			if _, err := io.ReadFull(from, status); err != nil {
				return fmt.Errorf("close status: %w", err)
			}
			if req.early {
				m.earlyStatus = status
				close(m.earlyReady)
			} else {
				req.daemon.reply = status
				close(req.daemon.ready)
			}
			m.mu.Lock()
			if m.failed == nil {
				m.failed = errDone // stops the helpers; writeDaemon sends the status
			}
			m.cond.Broadcast()
			m.mu.Unlock()
			return nil
		}
		b := make([]byte, hdrSize)
		if _, err := io.ReadFull(from, b); err != nil {
			return fmt.Errorf("reply to GET %#x+%d of %d: %w", req.h.vaddr, req.h.nr, req.h.dstID, err)
		}
		var h header
		h.decode(b)
		if h.nr > req.h.nr || h.vaddr != req.h.vaddr || h.dstID != req.h.dstID {
			return fmt.Errorf("reply %+v does not answer request %+v", h, req.h)
		}
		data, err := m.decode(h, from)
		if err != nil {
			return err
		}
		if !req.prefetch {
			m.st.Requests.Add(1)
			req.daemon.reply = append(b, data...)
			close(req.daemon.ready)
			m.mu.Lock()
			m.deliveredLocked(h.dstID, h.vaddr, h.nr)
			m.mu.Unlock()
			continue
		}
		m.mu.Lock()
		m.inFlight -= int64(req.h.nr * pageSize)
		for i := uint64(0); i < req.h.nr; i++ {
			delete(m.inflight, pageKey{uint32(req.h.dstID), req.h.vaddr + i*pageSize})
		}
		for i := uint64(0); i < h.nr; i++ {
			k := pageKey{uint32(h.dstID), h.vaddr + i*pageSize}
			if !m.owed.contains(k.pid, k.addr) {
				continue // the daemon got it meanwhile
			}
			if _, dup := m.cache[k]; !dup {
				m.cache[k] = data[i*pageSize : (i+1)*pageSize]
				m.cached += pageSize
			}
		}
		if h.nr < req.h.nr { // the server's run ended: ask for the rest next
			rest := Range{PID: uint32(h.dstID), Addr: h.vaddr + h.nr*pageSize, Pages: req.h.nr - h.nr}
			m.wanted.add(rest.PID, rest.Addr, rest.Pages)
			m.insertRestLocked(rest)
		}
		err = m.serveParkedLocked()
		m.cond.Broadcast()
		m.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// insertRestLocked puts the rest of a short prefetch reply at the head of
// the work left in address order (after the pages around faults, which
// go first, and the rests of lower addresses). CRIU's daemon walks the lazy pages in
// address order, so a rest left for last (as it once was) is a page the
// daemon asks the server for itself, and that reply, with every reply
// behind it, waits for all the prefetch in flight: a 1.2 GB post-copy
// migration crossed at 730 Mbit/s instead of 950 on 1 Gbit/s.
func (m *mux) insertRestLocked(rest Range) {
	k := 0
	for k < len(m.todo) && m.todo[k].PID == rest.PID && m.todo[k].Addr < rest.Addr {
		k++
	}
	m.todo = slices.Insert(m.todo, k, rest)
}

// releaseSlots wakes every daemon slot still waiting, empty (the
// connection failed).
func (m *mux) releaseSlots() {
	m.mu.Lock()
	pend := m.pending
	m.pending = nil
	parked := m.parked
	m.parked = nil
	m.mu.Unlock()
	for _, p := range parked {
		close(p.s.ready)
	}
	for _, r := range pend {
		switch {
		case r.early:
			close(m.earlyReady) // earlyStatus stays nil: the daemon's slot fails
		case !r.prefetch:
			close(r.daemon.ready)
		}
	}
}

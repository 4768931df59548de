package lazyproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testutil"
)

// strictPageServer is the seam CRIU's lazy page server sits behind, as
// strict as it is: it serves only the pages in lazy, a reply ends where
// the server's run of pages ends (every runPages pages), and a GET for a
// page it does not hold ends the connection (CRIU answers it with an
// error and gives up). bad counts such requests. onGet, if not nil, sees
// each GET first.
func strictPageServer(t *testing.T, l net.Listener, lazy map[pageKey]bool, runPages uint64, bad *atomic.Int64, closed *atomic.Bool, onGet func(header)) {
	t.Helper()
	servePages(l, func(h header) []byte {
		if onGet != nil {
			onGet(h)
		}
		pid := uint32(h.dstID)
		var n uint64
		for n < h.nr && lazy[pageKey{pid, h.vaddr + n*pageSize}] {
			n++
			if (h.vaddr/pageSize+n)%runPages == 0 {
				break
			}
		}
		if n == 0 {
			bad.Add(1)
			return nil
		}
		reply := encodeHeader(replyCmd, n, h.vaddr, h.dstID)
		for i := uint64(0); i < n; i++ {
			reply = append(reply, content(pid, h.vaddr+i*pageSize)...)
		}
		return reply
	}, func() { closed.Store(true) })
}

func startPrefetch(t *testing.T, ranges []Range) (string, *Stats, *atomic.Int64, *atomic.Bool) {
	t.Helper()
	return startPrefetchWith(t, ranges, 64, nil)
}

// startPrefetchWith serves ranges from a strictPageServer whose runs end
// every runPages pages, through ServePrefetch.
func startPrefetchWith(t *testing.T, ranges []Range, runPages uint64, onGet func(header)) (string, *Stats, *atomic.Int64, *atomic.Bool) {
	t.Helper()
	lazy := map[pageKey]bool{}
	for _, r := range ranges {
		for i := uint64(0); i < r.Pages; i++ {
			lazy[pageKey{r.PID, r.Addr + i*pageSize}] = true
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	criu, dst := listen(t), listen(t)
	var bad atomic.Int64
	var closed atomic.Bool
	strictPageServer(t, criu, lazy, runPages, &bad, &closed, onGet)
	var st Stats
	up := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", criu.Addr().String())
	}
	done := make(chan struct{})
	go func() { _ = ServePrefetch(ctx, dst, up, nil, ranges, &st, nil); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return dst.Addr().String(), &st, &bad, &closed
}

func readReply(t *testing.T, c net.Conn, pid uint32, vaddr, n uint64) uint64 {
	t.Helper()
	b := make([]byte, hdrSize)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	var h header
	h.decode(b)
	if h.nr == 0 || h.nr > n || h.vaddr != vaddr || h.dstID != uint64(pid) || h.cmd != replyCmd {
		t.Fatalf("reply %+v to GET %d %#x+%d", h, pid, vaddr, n)
	}
	page := make([]byte, pageSize)
	for i := uint64(0); i < h.nr; i++ {
		if _, err := io.ReadFull(c, page); err != nil {
			t.Fatal(err)
		}
		if a := vaddr + i*pageSize; !bytes.Equal(page, content(pid, a)) {
			t.Fatalf("page %#x of %d differs", a, pid)
		}
	}
	return h.nr
}

// waitCrossed waits, at most timeout, until n pages have crossed to the
// proxy.
func waitCrossed(t *testing.T, st *Stats, n int64, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		if got := st.DataPages.Load(); got < n {
			return fmt.Errorf("%d of %d pages crossed", got, n)
		}
		return nil
	})
}

// pageGet is a GET a strictPageServer was asked.
type pageGet struct{ vaddr, nr uint64 }

// getLog records the GETs a strictPageServer is asked, in order.
type getLog struct {
	mu   sync.Mutex
	gets []pageGet
}

// record is an onGet for strictPageServer that logs each GET and then
// takes delay to answer it.
func (l *getLog) record(delay time.Duration) func(header) {
	return func(h header) {
		l.mu.Lock()
		l.gets = append(l.gets, pageGet{h.vaddr, h.nr})
		l.mu.Unlock()
		time.Sleep(delay)
	}
}

// all returns the GETs so far.
func (l *getLog) all() []pageGet {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.gets)
}

// TestPrefetchAnswersFromAhead: after the daemon's first request the
// proxy pulls every lazy page, never asking the server for one it does not
// hold, and answers the daemon's later requests (pipelined, some across
// the server's runs) from what it pulled, in order and intact.
func TestPrefetchAnswersFromAhead(t *testing.T) {
	const a, b = 0x10000000, 0x20000000
	ranges := []Range{{PID: 7, Addr: a, Pages: 300}, {PID: 9, Addr: b, Pages: 10}}
	addr, st, bad, serverClosed := startPrefetch(t, ranges)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeHeader(cmdGet, 1, a+5*pageSize, 7)); err != nil {
		t.Fatal(err)
	}
	readReply(t, c, 7, a+5*pageSize, 1)
	waitCrossed(t, st, 310, 5*time.Second)
	type req struct {
		pid      uint32
		vaddr, n uint64
	}
	// Everything but the page the daemon already has, as CRIU's daemon
	// asks: never a page twice.
	reqs := []req{{7, a, 5}}
	for p := uint64(6); p < 300; p += 20 {
		reqs = append(reqs, req{7, a + p*pageSize, min(20, 300-p)})
	}
	reqs = append(reqs, req{9, b, 10})
	for _, r := range reqs {
		if _, err := c.Write(encodeHeader(cmdGet, r.n, r.vaddr, uint64(r.pid))); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range reqs {
		if got := readReply(t, c, r.pid, r.vaddr, r.n); got != r.n {
			t.Fatalf("GET %d %#x+%d answered with %d pages; the cache holds them all", r.pid, r.vaddr, r.n, got)
		}
	}
	// The daemon has every lazy page: the proxy ends the server's
	// session without waiting for the daemon's CLOSE, and answers that
	// CLOSE with the server's status.
	closeAfterServer(t, c, serverClosed, bad)
	// The first request too, when its page was on its way already.
	if n := st.Prefetched.Load(); n != 309 && n != 310 {
		t.Errorf("%d pages answered from the prefetch, want 309 or 310", n)
	}
	if st.DataPages.Load() != 310 {
		t.Errorf("%d pages crossed, want 310: each once", st.DataPages.Load())
	}
}

// TestPrefetchBeforeDaemon: the pages cross from the start, while CRIU
// restores, before the daemon connects (its first fault comes only once
// the restored service runs); the daemon then gets them all from the
// cache, and a second daemon connection is refused.
func TestPrefetchBeforeDaemon(t *testing.T) {
	const a = 0x30000000
	addr, st, bad, serverClosed := startPrefetch(t, []Range{{PID: 2, Addr: a, Pages: 100}})
	waitCrossed(t, st, 100, 5*time.Second) // before the daemon connects
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeHeader(cmdGet, 100, a, 2)); err != nil {
		t.Fatal(err)
	}
	if got := readReply(t, c, 2, a, 100); got != 100 {
		t.Fatalf("GET of all 100 pages: %d", got)
	}
	second, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	second.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(second, make([]byte, 1)); err == nil {
		t.Error("a second daemon connection was served")
	}
	closeAfterServer(t, c, serverClosed, bad)
	if st.DataPages.Load() != 100 || st.Prefetched.Load() != 100 {
		t.Errorf("%d pages crossed and %d came from the prefetch, want 100 and 100", st.DataPages.Load(), st.Prefetched.Load())
	}
}

// TestPrefetchDaemonGoneWithoutClose: a daemon that disconnects without
// CLOSE ends the connection's work; the proxy does not hang.
func TestPrefetchDaemonGoneWithoutClose(t *testing.T) {
	addr, _, _, _ := startPrefetch(t, []Range{{PID: 1, Addr: 0x1000000, Pages: 4096}})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeHeader(cmdGet, 1, 0x1000000, 1)); err != nil {
		t.Fatal(err)
	}
	readReply(t, c, 1, 0x1000000, 1)
	c.Close()
	// t.Cleanup cancels and waits for ServePrefetch: a hang fails the
	// test by its timeout.
}

// TestPrefetchCloseBeforeAllPages: a daemon that closes while pages are
// still owed gets the server's own answer to its CLOSE.
func TestPrefetchCloseBeforeAllPages(t *testing.T) {
	addr, _, _, serverClosed := startPrefetch(t, []Range{{PID: 1, Addr: 0x1000000, Pages: 64}})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeHeader(cmdGet, 1, 0x1000000, 1)); err != nil {
		t.Fatal(err)
	}
	readReply(t, c, 1, 0x1000000, 1)
	if serverClosed.Load() {
		t.Fatal("session closed while the daemon still lacked pages")
	}
	if _, err := c.Write(encodeHeader(cmdClose, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, 4)
	if _, err := io.ReadFull(c, status); err != nil || binary.LittleEndian.Uint32(status) != 0 {
		t.Fatalf("close status %v, %v", status, err)
	}
	if !serverClosed.Load() {
		t.Fatal("the daemon's CLOSE did not reach the server")
	}
}

// TestDestPrefetchHybrid: hybrid's chain (CRIU ← ServeSource ←
// ServePrefetch with the store) pulls every lazy run ahead of the daemon; pages the
// destination holds never cross, the daemon gets every page intact, and
// the session ends once it has them all.
func TestDestPrefetchHybrid(t *testing.T) {
	const a = 0x30000000
	ranges := []Range{{PID: 4, Addr: a, Pages: 200}}
	lazy := map[pageKey]bool{}
	for i := uint64(0); i < 200; i++ {
		lazy[pageKey{4, a + i*pageSize}] = true
	}
	var bad atomic.Int64
	var closed atomic.Bool
	addr, sst, dstat := chainWith(t, func(l net.Listener) { strictPageServer(t, l, lazy, 64, &bad, &closed, nil) },
		func(ctx context.Context, l net.Listener, up func(context.Context) (net.Conn, error), st *Stats) error {
			return ServePrefetch(ctx, l, up, store{}, ranges, st, nil)
		})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(encodeHeader(cmdGet, 1, a, 4)); err != nil {
		t.Fatal(err)
	}
	readReply(t, c, 4, a, 1)
	for deadline := time.Now().Add(5 * time.Second); dstat.HeldPages.Load()+dstat.DataPages.Load() < 200 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	for p := uint64(1); p < 200; p += 33 {
		n := min(33, 200-p)
		if _, err := c.Write(encodeHeader(cmdGet, n, a+p*pageSize, 4)); err != nil {
			t.Fatal(err)
		}
		if got := readReply(t, c, 4, a+p*pageSize, n); got != n {
			t.Fatalf("GET %#x+%d answered with %d pages", a+p*pageSize, n, got)
		}
	}
	closeAfterServer(t, c, &closed, &bad)
	if n := dstat.Prefetched.Load(); n != 199 && n != 200 {
		t.Errorf("%d pages given from the prefetch, want 199 or 200", n)
	}
	if sst.HeldPages.Load() == 0 || sst.DataPages.Load() == 0 {
		t.Errorf("source proxy: held %d, data %d; want both", sst.HeldPages.Load(), sst.DataPages.Load())
	}
}

// closeAfterServer waits until the page server got the proxy's own CLOSE
// (the daemon has every page), then closes as the daemon does and checks
// the status it gets and that the server was never asked for a page it
// does not hold.
func closeAfterServer(t *testing.T, c net.Conn, serverClosed *atomic.Bool, bad *atomic.Int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !serverClosed.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("the page server got no CLOSE after the daemon had every page")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := c.Write(encodeHeader(cmdClose, 0, 0, 0)); err != nil {
		t.Fatal(err)
	}
	status := make([]byte, 4)
	if _, err := io.ReadFull(c, status); err != nil || binary.LittleEndian.Uint32(status) != 0 {
		t.Fatalf("close status %v, %v", status, err)
	}
	if bad.Load() != 0 {
		t.Fatalf("%d requests for pages the server does not hold", bad.Load())
	}
}

// TestPrefetchShortReplies: a request that runs into a page the daemon no
// longer needs from the cache gets a short reply from the cache, and no
// page crosses twice.
func TestPrefetchShortReplies(t *testing.T) {
	const a = 0x40000000
	addr, st, bad, serverClosed := startPrefetch(t, []Range{{PID: 3, Addr: a, Pages: 100}})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	get := func(p, n uint64) uint64 {
		t.Helper()
		if _, err := c.Write(encodeHeader(cmdGet, n, a+p*pageSize, 3)); err != nil {
			t.Fatal(err)
		}
		return readReply(t, c, 3, a+p*pageSize, n)
	}
	get(50, 1)
	waitCrossed(t, st, 100, 5*time.Second)
	if got := get(40, 20); got != 10 {
		t.Fatalf("GET 40+20 with page 50 already given: %d pages, want a short reply of 10", got)
	}
	if got := get(51, 49); got != 49 {
		t.Fatalf("GET 51+49: %d pages", got)
	}
	if got := get(0, 40); got != 40 {
		t.Fatalf("GET 0+40: %d pages", got)
	}
	closeAfterServer(t, c, serverClosed, bad)
	if n := st.Prefetched.Load(); st.DataPages.Load() != 100 || (n != 99 && n != 100) {
		t.Errorf("%d pages crossed and %d came from the prefetch, want 100 and 99 or 100", st.DataPages.Load(), n)
	}
}

// TestPrefetchRunEndsAskedNext: where the server's run ends inside a
// prefetch request (a short reply), the rest of that request is asked for
// next, not after every other page: CRIU's daemon walks the lazy pages in
// address order, and a page the prefetch left for last is one the daemon
// must ask the server for itself, its reply (and every reply after it)
// waiting behind all the prefetch in flight (130 ms at 1 Gbit/s). A
// 1.2 GB post-copy migration ran at 730 Mbit/s instead of 950 that way.
func TestPrefetchRunEndsAskedNext(t *testing.T) {
	const a = 0x10000000
	const pages, run = 16384, 100 // 64 MiB; runs end inside the 256-page requests
	var gets getLog
	addr, st, bad, closed := startPrefetchWith(t, []Range{{PID: 5, Addr: a, Pages: pages}}, run, gets.record(0))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	// The first fault starts the prefetch; the daemon takes the rest once
	// it has all crossed, so only the prefetch's order is in the log.
	if _, err := c.Write(encodeHeader(cmdGet, 1, a, 5)); err != nil {
		t.Fatal(err)
	}
	readReply(t, c, 5, a, 1)
	waitCrossed(t, st, pages, 10*time.Second)
	for p := uint64(1); p < pages; {
		va := a + p*pageSize
		n := min(pages-p, 64)
		if _, err := c.Write(encodeHeader(cmdGet, n, va, 5)); err != nil {
			t.Fatal(err)
		}
		p += readReply(t, c, 5, va, n)
	}
	closeAfterServer(t, c, closed, bad)
	if n := st.DataPages.Load(); n != pages {
		t.Errorf("%d pages crossed, want %d: each once", n, pages)
	}

	log := gets.all()
	at := map[uint64]int{}
	for i, g := range log {
		at[g.vaddr] = i
	}
	// Asked for between the short request and its rest: what was already
	// on its way when the short reply was read (at most the in-flight
	// limit and the one request that crossed it), and the rests of lower
	// addresses still to be asked for then, which go first. Those are the
	// rests of requests that were on their way with it: at most as much
	// again (a burst of short replies read while the prefetch waits at its
	// limit; with one CPU the first bound, one in-flight limit and two
	// requests, was passed by up to 1.2 MB).
	const within = 2 * (prefetchInFlight + prefetchReqPages*pageSize)
	for i, g := range log {
		n := min(g.nr, run-(g.vaddr/pageSize)%run) // the server's reply
		if n == g.nr || (g.vaddr-a)/pageSize+n >= pages {
			continue
		}
		rest := g.vaddr + n*pageSize
		j, ok := at[rest]
		if !ok {
			t.Fatalf("the rest of GET %#x+%d (from %#x) was never asked for", g.vaddr, g.nr, rest)
		}
		var between uint64
		for _, h := range log[i+1 : j] {
			between += h.nr * pageSize
		}
		if between > within {
			t.Fatalf("the rest of GET %#x+%d (from %#x) was asked for after %d bytes more, want at most %d", g.vaddr, g.nr, rest, between, within)
		}
	}
}

// TestPrefetchFollowsFaults: a fault far from where the prefetch is (a
// page it would reach last) is asked for at once, and the prefetch goes
// on from there first, the few pages below (a stack grows down) and those
// above, before going back to where it was; while the daemon faults, at
// most prefetchInFlightFaulting of prefetched pages are ahead of a fault
// on the wire. Every page still crosses once.
func TestPrefetchFollowsFaults(t *testing.T) {
	const a, b = 0x10000000, 0x40000000
	const pages = 2048 // 8 MiB each
	ranges := []Range{{PID: 7, Addr: a, Pages: pages}, {PID: 7, Addr: b, Pages: pages}}
	// The server is slow (1 ms a request) and logs what it is asked.
	var gets getLog
	addr, st, bad, closed := startPrefetchWith(t, ranges, 1<<30, gets.record(time.Millisecond))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	// The first fault starts the prefetch at a; the second is far in b.
	if _, err := c.Write(encodeHeader(cmdGet, 1, a, 7)); err != nil {
		t.Fatal(err)
	}
	readReply(t, c, 7, a, 1)
	fault := uint64(b + 1000*pageSize)
	if _, err := c.Write(encodeHeader(cmdGet, 1, fault, 7)); err != nil {
		t.Fatal(err)
	}
	readReply(t, c, 7, fault, 1)
	// The daemon takes the rest, a run at a time, as CRIU's does.
	for _, r := range ranges {
		for p := uint64(0); p < r.Pages; {
			va := r.Addr + p*pageSize
			if va == a || va == fault {
				p++
				continue
			}
			n := uint64(1)
			for p+n < r.Pages && n < 64 && r.Addr+(p+n)*pageSize != fault {
				n++
			}
			if _, err := c.Write(encodeHeader(cmdGet, n, va, 7)); err != nil {
				t.Fatal(err)
			}
			p += readReply(t, c, 7, va, n)
		}
	}
	closeAfterServer(t, c, closed, bad)
	if n := st.DataPages.Load(); n != 2*pages {
		t.Errorf("%d pages crossed, want %d: each once", n, 2*pages)
	}

	log := gets.all()
	at := -1
	for i, g := range log {
		if g.vaddr == fault && g.nr == 1 {
			at = i
		}
	}
	if at < 0 {
		t.Fatalf("the fault at %#x was never asked for: %v", fault, log)
	}
	// Ahead of the fault: prefetch requests of a (1 MiB each) sent before
	// it, which the fault's reply waited behind.
	ahead := uint64(0)
	for _, g := range log[1:at] {
		ahead += g.nr * pageSize
	}
	if ahead > prefetchInFlightFaulting+prefetchReqPages*pageSize {
		t.Errorf("%d bytes of prefetch ahead of the fault, want at most %d while the daemon faults", ahead, prefetchInFlightFaulting+prefetchReqPages*pageSize)
	}
	next := log[at+1:]
	if len(next) < 2 || next[0].vaddr != fault-followBelow*pageSize || next[0].nr != followBelow || next[1].vaddr != fault+pageSize {
		t.Fatalf("after the fault at %#x the prefetch asked for %v; want the %d pages below it, then those above", fault, next[:min(len(next), 4)], followBelow)
	}
	// Above: followPages after the fault (in prefetchReqPages requests)
	// come before the prefetch returns to a.
	var above uint64
	for _, g := range next {
		if g.vaddr < b {
			break
		}
		if g.vaddr > fault {
			above += g.nr
		}
	}
	if above < followPages {
		t.Errorf("%d pages above the fault prefetched before going back to a, want %d", above, followPages)
	}
}

// TestInFlightLimit: before the daemon's first request (CRIU restoring)
// and while it faults, less in flight; the full amount once the faults
// are quiet, and a timer wakes the prefetch then.
func TestInFlightLimit(t *testing.T) {
	m := &mux{lastFault: time.Now().Add(-time.Hour), inFlight: prefetchInFlightFaulting}
	m.cond = sync.NewCond(&m.mu)
	m.mu.Lock()
	if got := m.inFlightLimitLocked(); got != prefetchInFlightFaulting || m.quietTimer != nil {
		t.Errorf("before the first request: limit %d (timer %v), want %d and no timer", got, m.quietTimer != nil, prefetchInFlightFaulting)
	}
	m.started, m.lastFault = true, time.Now()
	if got := m.inFlightLimitLocked(); got != prefetchInFlightFaulting {
		t.Errorf("faulting: limit %d, want %d", got, prefetchInFlightFaulting)
	}
	if m.quietTimer == nil {
		t.Fatal("held back by the faulting limit without a timer to wake it")
	}
	woke := make(chan struct{})
	go func() {
		m.mu.Lock()
		for m.quietTimer != nil {
			m.cond.Wait()
		}
		m.mu.Unlock()
		close(woke)
	}()
	m.mu.Unlock()
	select {
	case <-woke:
	case <-time.After(10 * faultQuiet):
		t.Fatal("the prefetch was not woken once the faults were quiet")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if got := m.inFlightLimitLocked(); got != prefetchInFlight {
		t.Errorf("quiet: limit %d, want %d", got, prefetchInFlight)
	}
}

// endOfSession accepts one connection on l, answers nothing and reports
// how the peer ended it: io.EOF for a clean close, another error for a
// reset.
func endOfSession(t *testing.T, l net.Listener) <-chan error {
	t.Helper()
	end := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			end <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(io.Discard, c)
		if err == nil {
			err = io.EOF // io.Copy hides a clean end of file
		}
		end <- err
	}()
	return end
}

// wantReset fails t unless the session endOfSession watches ended with a
// reset within 5 s.
func wantReset(t *testing.T, end <-chan error) {
	t.Helper()
	select {
	case err := <-end:
		if errors.Is(err, io.EOF) {
			t.Fatal("the page server saw end of file, not a reset")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the session with the page server did not end")
	}
}

// TestSessionWithoutCloseIsReset: CRIU's page server takes end of file
// before a CLOSE for a session that succeeded, and a lazy dump then kills
// the dumped tasks; a session the destination gives up on (the restore
// failed, the daemon never came or went away) must reach the server as a
// reset, so that the source can resume the service.
func TestSessionWithoutCloseIsReset(t *testing.T) {
	ranges := []Range{{PID: 1, Addr: 0x10000000, Pages: 4}}
	up := func(addr string) func(context.Context) (net.Conn, error) {
		return func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	t.Run("prefetch, no daemon", func(t *testing.T) {
		server := listen(t)
		end := endOfSession(t, server)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- ServePrefetch(ctx, listen(t), up(server.Addr().String()), nil, ranges, &Stats{}, nil) }()
		time.Sleep(50 * time.Millisecond) // connected, asking
		cancel()
		<-done
		wantReset(t, end)
	})
	t.Run("prefetch, daemon gone", func(t *testing.T) {
		server := listen(t)
		end := endOfSession(t, server)
		daemonL := listen(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = ServePrefetch(ctx, daemonL, up(server.Addr().String()), nil, ranges, &Stats{}, nil) }()
		d, err := net.Dial("tcp", daemonL.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		d.Close() // without CLOSE
		wantReset(t, end)
	})
	t.Run("relay", func(t *testing.T) {
		server := listen(t)
		end := endOfSession(t, server)
		srcL := listen(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			_ = ServeSource(ctx, srcL, server.Addr().String(), func(uint32, uint64, []byte) bool { return false }, &Stats{}, nil)
		}()
		d, err := net.Dial("tcp", srcL.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the relay's session is open
		d.Close()                         // without CLOSE
		wantReset(t, end)
	})
}

package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Dialer opens the client's connections; *net.Dialer satisfies it, and so
// does anything that dials from inside a network namespace.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// ClientConfig describes one client run.
type ClientConfig struct {
	Addr     string        // host:port of the probe server
	Period   time.Duration // interval between requests on each connection
	LineSize int           // bytes per request line including the newline (longer if the sequence number needs it)
	Conns    int           // parallel connections
	Duration time.Duration // how long to send; 0 means until ctx is done
	Drain    time.Duration // how long to wait for outstanding replies after the last request
	Timeline bool          // record every reply in Report.Timeline
	Dialer   Dialer        // nil means a net.Dialer with a 5 s timeout
}

// DefaultClientConfig returns the defaults of `edgehop probe client`.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{Period: 5 * time.Millisecond, LineSize: 64, Conns: 1, Duration: 10 * time.Second, Drain: time.Second}
}

// Validate checks the configuration.
func (c ClientConfig) Validate() error {
	switch {
	case c.Addr == "":
		return errors.New("no server address")
	case c.Period <= 0:
		return fmt.Errorf("period %v must be positive", c.Period)
	case c.LineSize < 1 || c.LineSize > 1<<20:
		return fmt.Errorf("line size %d outside 1..%d", c.LineSize, 1<<20)
	case c.Conns < 1 || c.Conns > 10000:
		return fmt.Errorf("connections %d outside 1..10000", c.Conns)
	case c.Duration < 0 || c.Drain < 0:
		return errors.New("negative duration")
	}
	return nil
}

// Report is the outcome of a client run. Durations are nanoseconds in JSON.
type Report struct {
	Addr     string        `json:"addr"`
	Conns    int           `json:"conns"`
	Period   time.Duration `json:"period_ns"`
	LineSize int           `json:"line_size"`
	Elapsed  time.Duration `json:"elapsed_ns"` // from the first dial to the last close

	Requests   uint64 `json:"requests"`
	Replies    uint64 `json:"replies"`
	Mismatches uint64 `json:"mismatches"`  // replies whose count or CRC differ from what was sent, malformed or unsolicited replies
	Resets     int    `json:"resets"`      // connections ended by the peer with RST (ECONNRESET, EPIPE)
	ConnErrors int    `json:"conn_errors"` // connections that failed otherwise: dial errors, EOF from the server, timeouts
	Unanswered uint64 `json:"unanswered"`  // requests without a reply when the run ended

	// MaxGap is the longest interval one connection went without a reply:
	// between consecutive replies, from the first request to the first
	// reply, or from the last reply to the end when requests were left
	// unanswered. MaxGapConn and MaxGapStart (offset from the start of the
	// run) say where it was.
	MaxGap      time.Duration `json:"max_gap_ns"`
	MaxGapConn  int           `json:"max_gap_conn"`
	MaxGapStart time.Duration `json:"max_gap_start_ns"`

	RTTp50 time.Duration `json:"rtt_p50_ns"`
	RTTp99 time.Duration `json:"rtt_p99_ns"`
	RTTMax time.Duration `json:"rtt_max_ns"`

	PerConn  []ConnReport `json:"per_conn"`
	Errors   []string     `json:"errors,omitempty"` // the first error of each failed connection (at most 10)
	Timeline []Sample     `json:"timeline,omitempty"`
}

// ConnReport is one connection's share of a Report.
type ConnReport struct {
	Conn        int           `json:"conn"`
	Requests    uint64        `json:"requests"`
	Replies     uint64        `json:"replies"`
	Mismatches  uint64        `json:"mismatches"`
	Unanswered  uint64        `json:"unanswered"`
	MaxGap      time.Duration `json:"max_gap_ns"`
	MaxGapStart time.Duration `json:"max_gap_start_ns"`
	Error       string        `json:"error,omitempty"`
}

// Sample is one reply in the timeline; times are offsets from the start of
// the run.
type Sample struct {
	Conn     int           `json:"conn"`
	Seq      uint64        `json:"seq"`
	Sent     time.Duration `json:"sent_ns"`
	Received time.Duration `json:"recv_ns"`
	OK       bool          `json:"ok"`
}

// Problem returns a one-line description of what broke continuity, or ""
// when every request got its correct reply on a connection that stayed up.
func (r Report) Problem() string {
	var parts []string
	count := func(n uint64, one, many string) {
		switch {
		case n == 1:
			parts = append(parts, "1 "+one)
		case n > 1:
			parts = append(parts, strconv.FormatUint(n, 10)+" "+many)
		}
	}
	count(r.Mismatches, "mismatch", "mismatches")
	count(uint64(r.Resets), "reset", "resets")
	count(uint64(r.ConnErrors), "connection error", "connection errors")
	count(r.Unanswered, "unanswered request", "unanswered requests")
	if len(parts) == 0 {
		return ""
	}
	s := strings.Join(parts, ", ")
	if len(r.Errors) > 0 {
		s += " (first: " + r.Errors[0] + ")"
	}
	return s
}

// RunClient runs cfg.Conns connections to cfg.Addr, each sending a request
// line every cfg.Period and checking every reply, until cfg.Duration has
// passed or ctx is done; it then waits up to cfg.Drain for outstanding
// replies and closes. Connection failures and wrong replies are counted in
// the Report, not returned: the error is only for an invalid configuration.
// It blocks until all its goroutines have finished.
func RunClient(ctx context.Context, cfg ClientConfig) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, fmt.Errorf("probe client: %w", err)
	}
	dialer := cfg.Dialer
	if dialer == nil {
		dialer = &net.Dialer{Timeout: 5 * time.Second}
	}
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if cfg.Duration > 0 {
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
	}
	defer cancel()

	start := time.Now()
	runs := make([]*connRun, cfg.Conns)
	var wg sync.WaitGroup
	for i := range runs {
		runs[i] = &connRun{id: i, cfg: &cfg, start: start, drained: make(chan struct{}), readerDone: make(chan struct{})}
		wg.Add(1)
		go func(r *connRun) {
			defer wg.Done()
			r.run(runCtx, dialer)
		}(runs[i])
	}
	wg.Wait()

	rep := Report{Addr: cfg.Addr, Conns: cfg.Conns, Period: cfg.Period, LineSize: cfg.LineSize, Elapsed: time.Since(start)}
	var hist histogram
	for _, r := range runs {
		cr := ConnReport{Conn: r.id, Requests: r.requests, Replies: r.replies, Mismatches: r.mismatches,
			Unanswered: r.unanswered, MaxGap: r.maxGap, MaxGapStart: r.maxGapStart}
		rep.Requests += r.requests
		rep.Replies += r.replies
		rep.Mismatches += r.mismatches
		rep.Unanswered += r.unanswered
		if r.maxGap > rep.MaxGap {
			rep.MaxGap, rep.MaxGapConn, rep.MaxGapStart = r.maxGap, r.id, r.maxGapStart
		}
		if r.err != nil {
			cr.Error = r.err.Error()
			if isReset(r.err) {
				rep.Resets++
			} else {
				rep.ConnErrors++
			}
			if len(rep.Errors) < 10 {
				rep.Errors = append(rep.Errors, fmt.Sprintf("conn %d: %v", r.id, r.err))
			}
		}
		hist.merge(&r.rtt)
		rep.Timeline = append(rep.Timeline, r.timeline...)
		rep.PerConn = append(rep.PerConn, cr)
	}
	rep.RTTp50, rep.RTTp99, rep.RTTMax = hist.quantile(0.50), hist.quantile(0.99), hist.max
	return rep, nil
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// pending is a request sent and not yet answered, with the reply it must get.
type pending struct {
	seq  uint64
	n    uint64
	crc  uint32
	sent time.Time
}

// connRun is one client connection. Its goroutine (run) writes requests
// and owns a reader goroutine that checks replies; counters written by the
// reader are read by run only after the reader has finished.
type connRun struct {
	id    int
	cfg   *ClientConfig
	start time.Time
	conn  net.Conn

	mu       sync.Mutex // guards queue, stopping, err
	queue    []pending
	stopping bool  // set before the connection is closed on purpose
	err      error // first connection error not caused by stopping

	drained    chan struct{} // closed by the reader once stopping and queue is empty
	readerDone chan struct{}

	// Owned by the writer (run).
	requests   uint64
	unanswered uint64

	// Owned by the reader until readerDone.
	replies, mismatches uint64
	lastReply           time.Time
	maxGap, maxGapStart time.Duration
	rtt                 histogram
	timeline            []Sample
}

func (r *connRun) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopping && r.err == nil {
		r.err = err
	}
}

func (r *connRun) run(ctx context.Context, d Dialer) {
	conn, err := d.DialContext(ctx, "tcp", r.cfg.Addr)
	if err != nil {
		if ctx.Err() == nil {
			r.err = fmt.Errorf("dial: %w", err)
		}
		close(r.readerDone)
		return
	}
	r.conn = conn
	r.lastReply = time.Now() // the first gap runs from the first request
	go r.read()

	// A write blocked on a dead peer must not outlive the run.
	unblock := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.stopping = true
		r.mu.Unlock()
		conn.SetWriteDeadline(time.Now())
	})
	r.send(ctx)
	unblock()

	r.mu.Lock()
	r.stopping = true
	empty := len(r.queue) == 0
	r.mu.Unlock()
	if !empty && r.cfg.Drain > 0 {
		t := time.NewTimer(r.cfg.Drain)
		select {
		case <-r.drained:
		case <-r.readerDone:
		case <-t.C:
		}
		t.Stop()
	}
	conn.Close()
	<-r.readerDone
	end := time.Now()

	r.mu.Lock()
	r.unanswered = uint64(len(r.queue))
	r.mu.Unlock()
	if r.unanswered > 0 {
		r.noteGap(end)
	}
}

// send writes one request per period until ctx is done or the reader or a
// write fails.
func (r *connRun) send(ctx context.Context) {
	tick := time.NewTicker(r.cfg.Period)
	defer tick.Stop()
	var (
		total uint64
		crc   uint32
		line  []byte
	)
	for seq := uint64(0); ; seq++ {
		line = strconv.AppendUint(line[:0], seq, 10)
		if pad := r.cfg.LineSize - len(line) - 1; pad > 0 {
			line = append(line, ' ')
			for range pad - 1 {
				line = append(line, 'x')
			}
		}
		line = append(line, '\n')
		total += uint64(len(line))
		crc = crc32.Update(crc, crc32.IEEETable, line)

		r.mu.Lock()
		if r.stopping {
			r.mu.Unlock()
			return
		}
		r.queue = append(r.queue, pending{seq: seq, n: total, crc: crc, sent: time.Now()})
		r.mu.Unlock()
		r.requests++
		if _, err := r.conn.Write(line); err != nil {
			r.fail(fmt.Errorf("write: %w", err))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-r.readerDone:
			return
		case <-tick.C:
		}
	}
}

// read checks replies until the connection fails or is closed.
func (r *connRun) read() {
	defer close(r.readerDone)
	br := bufio.NewReaderSize(r.conn, 4096)
	drainedClosed := false
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Far longer than any reply: a protocol violation.
			r.mismatches++
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err == nil {
				continue
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("server closed the connection")
			}
			r.fail(fmt.Errorf("read: %w", err))
			return
		}
		now := time.Now()
		n, crc, perr := ParseReply(line)

		r.mu.Lock()
		var want pending
		have := len(r.queue) > 0
		if have {
			want = r.queue[0]
			r.queue = r.queue[1:]
		}
		stopDrained := r.stopping && len(r.queue) == 0
		r.mu.Unlock()

		ok := have && perr == nil && n == want.n && crc == want.crc
		r.replies++
		if !ok {
			r.mismatches++
		}
		if have {
			r.rtt.add(now.Sub(want.sent))
			if r.cfg.Timeline {
				r.timeline = append(r.timeline, Sample{Conn: r.id, Seq: want.seq,
					Sent: want.sent.Sub(r.start), Received: now.Sub(r.start), OK: ok})
			}
		}
		r.noteGap(now)
		if stopDrained && !drainedClosed {
			close(r.drained)
			drainedClosed = true
		}
	}
}

func (r *connRun) noteGap(now time.Time) {
	if g := now.Sub(r.lastReply); g > r.maxGap {
		r.maxGap, r.maxGapStart = g, r.lastReply.Sub(r.start)
	}
	r.lastReply = now
}

// histogram keeps round-trip times in buckets about 2% wide, so quantiles
// of long runs cost constant memory.
type histogram struct {
	counts map[int]uint64
	total  uint64
	max    time.Duration
}

const bucketsPerDoubling = 35 // 2^(1/35) ≈ 1.02

func bucketOf(d time.Duration) int {
	if d < 1 {
		return 0
	}
	b := 0
	for v := uint64(d); v > 1; v >>= 1 {
		b += bucketsPerDoubling
	}
	// Refine within the doubling by linear interpolation of the mantissa.
	lo := uint64(1) << uint(b/bucketsPerDoubling)
	frac := float64(uint64(d)-lo) / float64(lo)
	return b + int(frac*bucketsPerDoubling)
}

func bucketValue(b int) time.Duration {
	lo := uint64(1) << uint(b/bucketsPerDoubling)
	frac := float64(b%bucketsPerDoubling) / bucketsPerDoubling
	return time.Duration(float64(lo) * (1 + frac))
}

func (h *histogram) add(d time.Duration) {
	if h.counts == nil {
		h.counts = map[int]uint64{}
	}
	h.counts[bucketOf(d)]++
	h.total++
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for b, c := range o.counts {
		if h.counts == nil {
			h.counts = map[int]uint64{}
		}
		h.counts[b] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

// quantile returns the lower edge of the bucket holding quantile q.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	bs := make([]int, 0, len(h.counts))
	for b := range h.counts {
		bs = append(bs, b)
	}
	slices.Sort(bs)
	rank := uint64(q*float64(h.total-1)) + 1
	var seen uint64
	for _, b := range bs {
		seen += h.counts[b]
		if seen >= rank {
			return min(bucketValue(b), h.max)
		}
	}
	return h.max
}

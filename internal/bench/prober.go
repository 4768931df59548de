package bench

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/probe"
)

// nsDialer opens TCP connections from inside a network namespace (the
// testbed's client). Plain TCP: the probe and redis are checkpointed with
// CRIU, which cannot handle MPTCP. When lastRead is set, every connection
// stores there the time (Unix ns) it last received data.
type nsDialer struct {
	ns       string
	lastRead *atomic.Int64
	timeout  time.Duration // of a connect; 0 is 5 s
}

func (d nsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := linux.InNetNS(d.ns, func() error {
		dl := &net.Dialer{Timeout: cmp.Or(d.timeout, 5*time.Second)}
		dl.SetMultipathTCP(false)
		var err error
		c, err = dl.DialContext(ctx, network, addr)
		return err
	})
	if err != nil || d.lastRead == nil {
		return c, err
	}
	return watchedConn{c, d.lastRead}, nil
}

// watchedConn notes when data last arrived, so the benchmark can tell
// live that a client has heard from the service again.
type watchedConn struct {
	net.Conn
	lastRead *atomic.Int64
}

func (c watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
	}
	return n, err
}

// waitListening polls addr from the dialer's namespace until a connection
// succeeds or timeout passes.
func waitListening(ctx context.Context, d nsDialer, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not reachable from the client after %v: %w", addr, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// segment is one probe client run (one connection).
type segment struct {
	start  time.Time
	cancel context.CancelFunc
	done   chan struct{}
	// Written by the client goroutine before done is closed.
	end time.Time
	rep probe.Report
	err error
}

// prober keeps a continuity probe client running against one address and
// opens a new connection when the current one has broken, so every
// migration is observed. Its methods are called from one goroutine; it owns
// the client goroutines and waits for them in stop.
type prober struct {
	cfg      probe.ClientConfig
	segs     []*segment
	lastRead *atomic.Int64 // written by the clients' connections
}

func newProber(addr string, d nsDialer) *prober {
	d.lastRead = new(atomic.Int64)
	return &prober{lastRead: d.lastRead, cfg: probe.ClientConfig{Addr: addr, Period: probePeriod, LineSize: probeLineSize, Conns: 1,
		Drain: 3 * time.Second, Timeline: true, Dialer: d}}
}

// Probe workload: one connection, a request every 5 ms.
const (
	probePeriod   = 5 * time.Millisecond
	probeLineSize = 64
)

// start opens a new client connection.
func (p *prober) start(ctx context.Context) {
	cctx, cancel := context.WithCancel(ctx)
	s := &segment{start: time.Now(), cancel: cancel, done: make(chan struct{})}
	p.segs = append(p.segs, s)
	go func() {
		defer close(s.done)
		s.rep, s.err = probe.RunClient(cctx, p.cfg)
		s.end = time.Now()
	}()
}

// ensure opens a new connection when the current one has ended (reset or
// error) and reports whether it had to.
func (p *prober) ensure(ctx context.Context) bool {
	if len(p.segs) > 0 {
		select {
		case <-p.segs[len(p.segs)-1].done:
		default:
			return false
		}
	}
	p.start(ctx)
	return true
}

// recovered waits until a reply has arrived after t, so that one
// migration's silence (TCP's retransmission back-off can make it much
// longer than the downtime) never runs into the next migration's window.
// A connection that stays silent for timeout is abandoned and a new one
// opened; the returned flag says so.
func (p *prober) recovered(ctx context.Context, t time.Time, timeout time.Duration) (reconnected bool, err error) {
	reconnected = p.ensure(ctx)
	deadline := time.Now().Add(timeout)
	for p.lastRead.Load() <= t.UnixNano() {
		if time.Now().After(deadline) {
			if reconnected {
				return true, fmt.Errorf("no probe reply within %v on a new connection either", timeout)
			}
			p.segs[len(p.segs)-1].cancel()
			<-p.segs[len(p.segs)-1].done
			p.start(ctx)
			reconnected, deadline = true, time.Now().Add(timeout)
			continue
		}
		if p.ensure(ctx) {
			reconnected = true
		}
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return reconnected, err
		}
	}
	return reconnected, nil
}

// stop ends every client (waiting for outstanding replies) and returns
// the merged observation.
func (p *prober) stop() (observation, error) {
	for _, s := range p.segs {
		s.cancel()
	}
	var o observation
	for _, s := range p.segs {
		<-s.done
		if s.err != nil {
			return o, s.err
		}
		r := s.rep
		o.conns++
		o.requests += r.Requests
		o.replies += r.Replies
		o.unanswered += r.Unanswered
		o.mismatches += r.Mismatches
		o.resets += r.Resets
		o.connErrors += r.ConnErrors
		o.errors = append(o.errors, r.Errors...)
		o.rttP50 = max(o.rttP50, r.RTTp50)
		o.rttP99 = max(o.rttP99, r.RTTp99)
		for _, smp := range r.Timeline {
			o.replyTimes = append(o.replyTimes, s.start.Add(smp.Received))
		}
		if s.end.After(o.end) {
			o.end = s.end
		}
	}
	slices.SortFunc(o.replyTimes, func(a, b time.Time) int { return a.Compare(b) })
	return o, nil
}

// observation is what the probe clients saw over a whole session.
type observation struct {
	conns                                     int
	requests, replies, unanswered, mismatches uint64
	resets, connErrors                        int
	errors                                    []string
	rttP50, rttP99                            time.Duration // worst connection's
	replyTimes                                []time.Time   // sorted
	end                                       time.Time
}

// lostBytes is the request bytes that never got a correct reply: requests
// left unanswered when a connection ended, and requests whose reply's byte
// count or CRC showed the stream the server received was not the one sent.
// Every request line is probeLineSize bytes.
func (o observation) lostBytes() uint64 { return (o.unanswered + o.mismatches) * probeLineSize }

// recoverTimeout bounds how long a client may stay silent after a
// migration before its connection counts as dead.
const recoverTimeout = 30 * time.Second

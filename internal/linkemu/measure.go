package linkemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// MeasureConfig says what Measure measures.
type MeasureConfig struct {
	// FromNS and ToNS are the namespace paths of the client and the
	// server; empty means the caller's namespace.
	FromNS, ToNS string
	// ToAddr is an IP address in ToNS that FromNS reaches.
	ToAddr string
	// Pings is the number of RTT samples (default 50).
	Pings int
	// Duration is how long the bulk transfer runs (default 3 s); negative
	// skips it.
	Duration time.Duration
}

// Measurement is what Measure saw.
type Measurement struct {
	// RTT statistics of 64-byte request/response exchanges over one
	// persistent TCP connection (Nagle off), on an otherwise idle link.
	RTTMin, RTTMedian, RTTP99, RTTMax time.Duration
	Pings                             int
	// Throughput is the From→To goodput in bits/s from the end of the
	// warm-up (the first quarter of the transfer, which holds TCP slow
	// start) to the last byte; AvgThroughput counts the whole transfer.
	Throughput, AvgThroughput float64
	// Bytes received in Elapsed (first to last byte at the receiver).
	Bytes   int64
	Elapsed time.Duration
}

// Mbps returns Throughput in Mbit/s.
func (m Measurement) Mbps() float64 { return m.Throughput / 1e6 }

// Measure measures RTT and bulk TCP throughput from FromNS to ToNS: it
// runs a TCP echo/sink server in ToNS and a client in FromNS, both in this
// process.
func Measure(ctx context.Context, cfg MeasureConfig) (Measurement, error) {
	if cfg.Pings <= 0 {
		cfg.Pings = 50
	}
	if cfg.Duration == 0 {
		cfg.Duration = 3 * time.Second
	}
	if net.ParseIP(cfg.ToAddr) == nil {
		return Measurement{}, fmt.Errorf("measure: bad address %q", cfg.ToAddr)
	}
	var ln net.Listener
	err := inNS(cfg.ToNS, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(cfg.ToAddr, "0"))
		return err
	})
	if err != nil {
		return Measurement{}, fmt.Errorf("measure: listen in %s: %w", cfg.ToNS, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	srv := &sinkServer{ln: ln, results: make(chan sinkResult, 1)}
	srv.wg.Add(1)
	go func() {
		defer srv.wg.Done()
		srv.serve(ctx)
	}()
	defer func() {
		cancel()
		ln.Close()
		srv.wg.Wait()
	}()
	addr := ln.Addr().String()

	var m Measurement
	if err := measureRTT(ctx, cfg, addr, &m); err != nil {
		return m, fmt.Errorf("measure rtt: %w", err)
	}
	if cfg.Duration > 0 {
		if err := measureBulk(ctx, cfg, addr, srv.results, &m); err != nil {
			return m, fmt.Errorf("measure throughput: %w", err)
		}
	}
	return m, nil
}

func inNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return linux.InNetNS(path, fn)
}

// dial connects from namespace ns; the socket stays in ns afterwards.
func dial(ctx context.Context, ns, addr string) (*net.TCPConn, error) {
	var c net.Conn
	err := inNS(ns, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

const pingSize = 64

func measureRTT(ctx context.Context, cfg MeasureConfig, addr string, m *Measurement) error {
	c, err := dial(ctx, cfg.FromNS, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write([]byte{'e'}); err != nil {
		return err
	}
	buf := make([]byte, pingSize)
	rtts := make([]time.Duration, 0, cfg.Pings)
	for i := -1; i < cfg.Pings; i++ { // i == -1: warm-up, not counted
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			return errors.Join(err, ctx.Err())
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return errors.Join(err, ctx.Err())
		}
		if i >= 0 {
			rtts = append(rtts, time.Since(t0))
		}
	}
	slices.Sort(rtts)
	m.Pings = len(rtts)
	m.RTTMin, m.RTTMax = rtts[0], rtts[len(rtts)-1]
	m.RTTMedian = quantile(rtts, 0.5)
	m.RTTP99 = quantile(rtts, 0.99)
	return nil
}

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func measureBulk(ctx context.Context, cfg MeasureConfig, addr string, results <-chan sinkResult, m *Measurement) error {
	c, err := dial(ctx, cfg.FromNS, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, 256<<10)
	buf[0] = 's'
	end := time.Now().Add(cfg.Duration)
	_ = c.SetWriteDeadline(end)
	for time.Now().Before(end) {
		if _, err := c.Write(buf); err != nil {
			if errors.Is(err, ctx.Err()) || ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			return err
		}
	}
	_ = c.SetWriteDeadline(time.Time{})
	if err := c.CloseWrite(); err != nil {
		return err
	}
	select {
	case r := <-results:
		if r.err != nil {
			return r.err
		}
		m.Bytes, m.Elapsed = r.bytes, r.elapsed
		if r.elapsed > 0 {
			m.AvgThroughput = float64(r.bytes*8) / r.elapsed.Seconds()
		}
		if r.steadyElapsed > 0 {
			m.Throughput = float64(r.steadyBytes*8) / r.steadyElapsed.Seconds()
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sinkServer answers echo connections (first byte 'e') and counts the
// bytes of sink connections (first byte 's').
type sinkServer struct {
	ln      net.Listener
	results chan sinkResult // one per sink connection
	wg      sync.WaitGroup
}

type sinkResult struct {
	bytes         int64
	elapsed       time.Duration
	steadyBytes   int64
	steadyElapsed time.Duration
	err           error
}

func (s *sinkServer) serve(ctx context.Context) {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			s.handle(ctx, c)
		}()
	}
}

func (s *sinkServer) handle(ctx context.Context, c net.Conn) {
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		return
	}
	switch kind[0] {
	case 'e':
		buf := make([]byte, pingSize)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	case 's':
		select {
		case s.results <- sink(c):
		case <-ctx.Done():
		}
	}
}

// sink reads c to EOF, recording when bytes arrived.
func sink(c net.Conn) sinkResult {
	type mark struct {
		t time.Time
		n int64
	}
	buf := make([]byte, 256<<10)
	var marks []mark
	var n int64
	for {
		k, err := c.Read(buf)
		if k > 0 {
			n += int64(k)
			marks = append(marks, mark{time.Now(), n})
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return sinkResult{err: fmt.Errorf("sink after %d bytes: %w", n, err)}
		}
	}
	if len(marks) < 2 {
		return sinkResult{bytes: n, err: fmt.Errorf("sink received only %d bytes", n)}
	}
	first, last := marks[0], marks[len(marks)-1]
	r := sinkResult{bytes: n - first.n, elapsed: last.t.Sub(first.t)}
	warm := first.t.Add(r.elapsed / 4)
	i, _ := slices.BinarySearchFunc(marks, warm, func(m mark, t time.Time) int { return m.t.Compare(t) })
	if i >= len(marks)-1 {
		i = 0
	}
	r.steadyBytes, r.steadyElapsed = last.n-marks[i].n, last.t.Sub(marks[i].t)
	return r
}

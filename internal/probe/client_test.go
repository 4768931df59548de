package probe

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeServer accepts connections on loopback and hands each to handle,
// a deliberately wrong server; everything stops when the test ends.
func fakeServer(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// replyEach answers every line with reply(count of bytes so far, correct CRC, line number).
func replyEach(reply func(n uint64, crc uint32, k int) string) func(net.Conn) {
	return func(c net.Conn) {
		var cnt Counter
		br := bufio.NewReader(c)
		for k := 0; ; k++ {
			line, err := br.ReadBytes('\n')
			if err != nil {
				return
			}
			cnt.Feed(nil, line)
			n, crc := cnt.Total()
			if _, err := c.Write([]byte(reply(n, crc, k))); err != nil {
				return
			}
		}
	}
}

func quickConfig(addr string) ClientConfig {
	cfg := DefaultClientConfig()
	cfg.Addr = addr
	cfg.Period = 2 * time.Millisecond
	cfg.Duration = 200 * time.Millisecond
	return cfg
}

func TestClientAgainstServer(t *testing.T) {
	addr := startServer(t)
	tests := []struct {
		name  string
		conns int
		size  int
	}{
		{"one connection", 1, 64},
		{"tiny lines", 1, 1},
		{"many connections", 30, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := quickConfig(addr)
			cfg.Conns, cfg.LineSize, cfg.Timeline = tt.conns, tt.size, true
			rep, err := RunClient(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if p := rep.Problem(); p != "" {
				t.Fatalf("problem against a correct server: %s\n%+v", p, rep)
			}
			if rep.Requests < uint64(tt.conns)*10 || rep.Replies != rep.Requests {
				t.Fatalf("requests %d replies %d: want >= %d requests, all answered", rep.Requests, rep.Replies, tt.conns*10)
			}
			if len(rep.PerConn) != tt.conns || uint64(len(rep.Timeline)) != rep.Replies {
				t.Fatalf("per-conn %d timeline %d, want %d and %d", len(rep.PerConn), len(rep.Timeline), tt.conns, rep.Replies)
			}
			if rep.MaxGap <= 0 || rep.MaxGap > 2*time.Second || rep.RTTp50 <= 0 || rep.RTTp50 > rep.RTTMax {
				t.Fatalf("implausible gap %v / rtt p50 %v max %v", rep.MaxGap, rep.RTTp50, rep.RTTMax)
			}
			if _, err := json.Marshal(rep); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A server that lies must be caught: every kind of wrong reply counts.
func TestClientDetectsWrongServer(t *testing.T) {
	tests := []struct {
		name  string
		reply func(n uint64, crc uint32, k int) string
	}{
		{"does not count the newline", func(n uint64, crc uint32, _ int) string { return string(AppendReply(nil, n-1, crc)) }},
		{"wrong crc", func(n uint64, crc uint32, _ int) string { return string(AppendReply(nil, n, crc^1)) }},
		{"malformed", func(n uint64, crc uint32, _ int) string { return fmt.Sprintf("%d %X\n", n, crc) }},
		{"one bad reply among good", func(n uint64, crc uint32, k int) string {
			if k == 5 {
				crc++
			}
			return string(AppendReply(nil, n, crc))
		}},
		{"extra reply", func(n uint64, crc uint32, k int) string {
			r := string(AppendReply(nil, n, crc))
			if k == 3 {
				r += r
			}
			return r
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := fakeServer(t, replyEach(tt.reply))
			rep, err := RunClient(context.Background(), quickConfig(addr))
			if err != nil {
				t.Fatal(err)
			}
			if rep.Mismatches == 0 || !strings.Contains(rep.Problem(), "mismatch") {
				t.Fatalf("wrong server not detected: %+v", rep)
			}
		})
	}
}

func TestClientCountsConnectionFailures(t *testing.T) {
	t.Run("reset", func(t *testing.T) {
		addr := fakeServer(t, func(c net.Conn) {
			replyEach(func(n uint64, crc uint32, k int) string {
				if k == 10 {
					c.(*net.TCPConn).SetLinger(0) // close sends RST
					c.Close()
				}
				return string(AppendReply(nil, n, crc))
			})(c)
		})
		rep, err := RunClient(context.Background(), quickConfig(addr))
		if err != nil {
			t.Fatal(err)
		}
		if rep.Resets != 1 || rep.Replies != 10 || !strings.Contains(rep.Problem(), "1 reset") {
			t.Fatalf("want 1 reset after 10 replies: %+v", rep)
		}
	})
	t.Run("server closes", func(t *testing.T) {
		// Read the first request, then close cleanly (FIN, not RST).
		addr := fakeServer(t, func(c net.Conn) { bufio.NewReader(c).ReadString('\n') })
		rep, err := RunClient(context.Background(), quickConfig(addr))
		if err != nil {
			t.Fatal(err)
		}
		if rep.ConnErrors != 1 || rep.Problem() == "" {
			t.Fatalf("want 1 connection error: %+v", rep)
		}
	})
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cfg := quickConfig(addr)
		cfg.Conns = 3
		rep, err := RunClient(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rep.ConnErrors != 3 || rep.Requests != 0 || !strings.Contains(rep.Errors[0], "dial") {
			t.Fatalf("want 3 dial errors: %+v", rep)
		}
	})
	t.Run("silent server", func(t *testing.T) {
		addr := fakeServer(t, func(c net.Conn) { io.Copy(io.Discard, c) })
		cfg := quickConfig(addr)
		cfg.Drain = 50 * time.Millisecond
		rep, err := RunClient(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Unanswered == 0 || rep.Unanswered != rep.Requests || rep.MaxGap < cfg.Duration {
			t.Fatalf("want all requests unanswered and a gap >= %v: %+v", cfg.Duration, rep)
		}
	})
}

// The gap is what a client sees while the server stalls.
func TestClientMeasuresGap(t *testing.T) {
	const stall = 150 * time.Millisecond
	addr := fakeServer(t, replyEach(func(n uint64, crc uint32, k int) string {
		if k == 20 {
			time.Sleep(stall)
		}
		return string(AppendReply(nil, n, crc))
	}))
	cfg := quickConfig(addr)
	cfg.Duration = 300 * time.Millisecond
	rep, err := RunClient(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p := rep.Problem(); p != "" {
		t.Fatal(p)
	}
	if rep.MaxGap < stall || rep.MaxGap > stall+100*time.Millisecond {
		t.Fatalf("max gap %v, want about %v", rep.MaxGap, stall)
	}
	// The stall begins after the reply to request 19 (sent at 19 periods).
	if rep.MaxGapStart < 15*cfg.Period || rep.MaxGapStart > 20*cfg.Period+100*time.Millisecond {
		t.Fatalf("gap started at %v, want about %v", rep.MaxGapStart, 19*cfg.Period)
	}
}

func TestClientStopsOnContext(t *testing.T) {
	addr := startServer(t)
	cfg := quickConfig(addr)
	cfg.Duration = 0 // until ctx
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	rep, err := RunClient(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("RunClient took %v after a 100 ms context", el)
	}
	if rep.Problem() != "" || rep.Replies == 0 {
		t.Fatalf("want a clean run: %+v", rep)
	}
}

func TestClientConfigValidate(t *testing.T) {
	good := quickConfig("127.0.0.1:1")
	tests := []struct {
		name string
		mod  func(*ClientConfig)
	}{
		{"no addr", func(c *ClientConfig) { c.Addr = "" }},
		{"zero period", func(c *ClientConfig) { c.Period = 0 }},
		{"zero size", func(c *ClientConfig) { c.LineSize = 0 }},
		{"no conns", func(c *ClientConfig) { c.Conns = 0 }},
		{"negative duration", func(c *ClientConfig) { c.Duration = -1 }},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tt := range tests {
		cfg := good
		tt.mod(&cfg)
		if _, err := RunClient(context.Background(), cfg); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.add(time.Duration(i) * time.Microsecond)
	}
	for _, q := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}} {
		got := h.quantile(q.q)
		if d := got - q.want; d < -q.want/25 || d > q.want/25 {
			t.Errorf("quantile %v = %v, want %v ± 4%%", q.q, got, q.want)
		}
	}
	if h.max != time.Millisecond {
		t.Errorf("max %v", h.max)
	}
}

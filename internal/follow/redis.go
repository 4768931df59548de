package follow

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// dial opens a plain TCP connection from inside the namespace ns (CRIU
// checkpoints the service's TCP connections; MPTCP it cannot).
func dial(ctx context.Context, ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := linux.InNetNS(ns, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		d.SetMultipathTCP(false)
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// redisConn is one request-response RESP connection.
type redisConn struct {
	c net.Conn
	r *bufio.Reader
	w []byte
}

func (rc *redisConn) cmd(args ...string) (string, error) {
	rc.w = rc.w[:0]
	rc.w = fmt.Appendf(rc.w, "*%d\r\n", len(args))
	for _, a := range args {
		rc.w = fmt.Appendf(rc.w, "$%d\r\n%s\r\n", len(a), a)
	}
	_ = rc.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := rc.c.Write(rc.w); err != nil {
		return "", err
	}
	return rc.read()
}

// read reads one reply.
func (rc *redisConn) read() (string, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) < 3 {
		return "", fmt.Errorf("redis: short reply %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return "", fmt.Errorf("redis: %s", body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", fmt.Errorf("redis: bad bulk %q", line)
		}
		if n < 0 {
			return "", errNil
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(rc.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("redis: unexpected reply %q", line)
}

var errNil = errors.New("redis: nil")

func ioReadFull(r *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// value is key i's expected content.
func value(prefix string, i, size int) string {
	v := fmt.Sprintf("%s-%d-", prefix, i)
	for len(v) < size {
		v += string(rune('a' + i%26))
	}
	return v[:size]
}

// Load is a redis client's load: conns connections, each a loop of
// GET of a preloaded key (checked) and SET of a key of its own (every
// tenth operation), counting operations and latency per second.
type Load struct {
	Name    string
	mu      sync.Mutex // guards series and errs
	series  []Sample
	errs    []string
	ops     atomic.Int64
	latNs   atomic.Int64
	written []atomic.Int64 // per connection: keys written and acknowledged
}

// Sample is one second of a load.
type Sample struct {
	T         float64 `json:"t_s"` // since the start
	Ops       float64 `json:"ops_per_s"`
	LatencyMs float64 `json:"latency_ms"` // mean of that second
	Errors    int     `json:"errors"`
}

// Preload fills keys 0..n-1 with size-byte values.
func Preload(ctx context.Context, ns, addr string, n, size int) error {
	c, err := dial(ctx, ns, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	rc := &redisConn{c: c, r: bufio.NewReader(c)}
	// Pipelined in batches.
	for i := 0; i < n; i += 500 {
		var buf []byte
		m := 0
		for j := i; j < n && j < i+500; j++ {
			v := value("k", j, size)
			k := "k" + strconv.Itoa(j)
			buf = fmt.Appendf(buf, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(k), k, len(v), v)
			m++
		}
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := c.Write(buf); err != nil {
			return err
		}
		for k := 0; k < m; k++ {
			if _, err := rc.r.ReadString('\n'); err != nil {
				return err
			}
		}
	}
	return nil
}

// Run runs the load until ctx ends; start is the series' time origin.
func (l *Load) Run(ctx context.Context, ns, addr string, conns, keys, size int, start time.Time) error {
	l.written = make([]atomic.Int64, conns)
	var wg sync.WaitGroup
	rcs := make([]*redisConn, conns)
	for i := range rcs {
		c, err := dial(ctx, ns, addr)
		if err != nil {
			for _, rc := range rcs[:i] {
				rc.c.Close()
			}
			return fmt.Errorf("%s: connect: %w", l.Name, err)
		}
		rcs[i] = &redisConn{c: c, r: bufio.NewReader(c)}
	}
	for i, rc := range rcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rc.c.Close()
			go func() { <-ctx.Done(); _ = rc.c.SetDeadline(time.Now()) }()
			for n := 0; ctx.Err() == nil; n++ {
				t0 := time.Now()
				var err error
				if n%10 == 9 {
					w := int(l.written[i].Load())
					k := fmt.Sprintf("w%d-%d", i, w)
					if _, err = rc.cmd("SET", k, value(k, w, size)); err == nil {
						l.written[i].Add(1)
					}
				} else {
					j := (n*7919 + i) % keys
					var got string
					if got, err = rc.cmd("GET", "k"+strconv.Itoa(j)); err == nil && got != value("k", j, size) {
						err = fmt.Errorf("GET k%d: wrong value", j)
					}
				}
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					l.fail(fmt.Errorf("connection %d: %w", i, err))
					return
				}
				l.ops.Add(1)
				l.latNs.Add(int64(time.Since(t0)))
			}
		}()
	}
	// One sample a second.
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastOps, lastLat int64
	lastErrs := 0
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil
		case now := <-t.C:
			ops, lat := l.ops.Load(), l.latNs.Load()
			s := Sample{T: now.Sub(start).Seconds(), Ops: float64(ops - lastOps)}
			if ops > lastOps {
				s.LatencyMs = float64(lat-lastLat) / float64(ops-lastOps) / 1e6
			}
			l.mu.Lock()
			s.Errors = len(l.errs) - lastErrs
			lastErrs = len(l.errs)
			l.series = append(l.series, s)
			l.mu.Unlock()
			lastOps, lastLat = ops, lat
		}
	}
}

func (l *Load) fail(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err.Error())
	l.mu.Unlock()
}

// Series returns the samples so far.
func (l *Load) Series() []Sample {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Sample(nil), l.series...)
}

// Errors returns the errors so far.
func (l *Load) Errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

// Verify checks, on a fresh connection, every preloaded key and every key
// the load wrote and had acknowledged, pipelined (the user may be far).
func (l *Load) Verify(ctx context.Context, ns, addr string, keys, size int) error {
	c, err := dial(ctx, ns, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	rc := &redisConn{c: c, r: bufio.NewReader(c)}
	type kv struct{ k, v string }
	var want []kv
	for j := 0; j < keys; j++ {
		want = append(want, kv{"k" + strconv.Itoa(j), value("k", j, size)})
	}
	for i := range l.written {
		for w := 0; w < int(l.written[i].Load()); w++ {
			k := fmt.Sprintf("w%d-%d", i, w)
			want = append(want, kv{k, value(k, w, size)})
		}
	}
	for i := 0; i < len(want); i += 500 {
		batch := want[i:min(i+500, len(want))]
		var buf []byte
		for _, x := range batch {
			buf = fmt.Appendf(buf, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(x.k), x.k)
		}
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := c.Write(buf); err != nil {
			return err
		}
		for _, x := range batch {
			got, err := rc.read()
			if err != nil || got != x.v {
				return fmt.Errorf("%s: key %s lost or wrong (%v)", l.Name, x.k, err)
			}
		}
	}
	return nil
}

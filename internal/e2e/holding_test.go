package e2e

import (
	"bufio"
	"context"
	"fmt"
	"hash/crc32"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// churnClient opens a new probe connection after another, each asking
// one question and checking the answer, and records every failure and
// the slowest connection (dial to verified reply).
type churnClient struct {
	mu      sync.Mutex
	ok      int
	errs    []string
	slowest time.Duration
	times   []time.Duration
}

func (cc *churnClient) once(ctx context.Context, ns, addr string, i int) {
	start := time.Now()
	err := func() error {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		conn, err := nsDialer{ns}.DialContext(dctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
		line := fmt.Sprintf("hello %d\n", i)
		if _, err := conn.Write([]byte(line)); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		reply, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		var count int
		var crc uint32
		if _, err := fmt.Sscanf(reply, "%d %x", &count, &crc); err != nil || count != len(line) || crc != crc32.ChecksumIEEE([]byte(line)) {
			return fmt.Errorf("reply %q does not answer %q", reply, line)
		}
		return nil
	}()
	if ctx.Err() != nil {
		return // the test is over; not the service's failure
	}
	d := time.Since(start)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if err != nil {
		cc.errs = append(cc.errs, fmt.Sprintf("%s: %v", start.Format("15:04:05.000"), err))
		return
	}
	cc.ok++
	cc.times = append(cc.times, d)
	if d > cc.slowest {
		cc.slowest = d
	}
}

// TestNewConnectionsWaitDuringMigration: four clients open connections
// in a loop (connect, one request, its verified reply, close) while the
// probe is migrated across three nodes with each strategy. A connection
// that arrives while the service is frozen or moving waits, held at the
// destination (a request that reached the source from just before the
// freeze is forwarded there), and is served once the service is restored:
// no reset, no timeout, no wrong answer. The latency such clients see is
// logged.
func TestNewConnectionsWaitDuringMigration(t *testing.T) {
	e, st, c := probeTestbed(t)
	ns, addr := linux.NetNSPath(st.Clients[0].NetNS), net.JoinHostPort(c.IP, "7000")

	ctx, cancel := context.WithCancel(context.Background())
	cc := &churnClient{}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				cc.once(ctx, ns, addr, i)
			}
		}()
	}
	at, forwarded := 0, 0
	for _, strategy := range []string{"stop-and-copy", "pre-copy", "post-copy", "hybrid"} {
		for k := 0; k < 2; k++ {
			to := st.Nodes[(at+1)%3].Name
			cc.mu.Lock()
			before := cc.ok
			cc.mu.Unlock()
			var res migResult
			e.mustJSON(&res, "migrate", "p", "--to", to, "--strategy", strategy, "--json")
			if !res.OK {
				t.Fatalf("%s to %s: %+v", strategy, to, res)
			}
			forwarded += res.ForwardedConnections
			at++
			// Connections go on being served on the new node.
			deadline := time.Now().Add(20 * time.Second)
			for {
				cc.mu.Lock()
				n := cc.ok
				cc.mu.Unlock()
				if n > before+20 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s to %s: no new connection served for 20 s", strategy, to)
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("%s -> %s: downtime %.1f ms, %d connection requests and %d other packets forwarded", strategy, to, res.DowntimeMs, res.ForwardedConnections, res.ForwardedPackets)
		}
	}
	cancel()
	wg.Wait()
	sort.Slice(cc.times, func(i, j int) bool { return cc.times[i] < cc.times[j] })
	p := func(q float64) time.Duration { return cc.times[int(q*float64(len(cc.times)-1))] }
	t.Logf("%d connections served, %d failed; connect-to-reply p50 %v, p99 %v, slowest %v",
		cc.ok, len(cc.errs), p(0.5), p(0.99), cc.slowest)
	if forwarded == 0 {
		t.Errorf("no connection request arriving around a freeze was held and forwarded in 8 migrations")
	}
	t.Logf("%d connection requests held at a source and forwarded", forwarded)
	if len(cc.errs) > 0 {
		t.Errorf("%d new connections failed during migrations, e.g. %v", len(cc.errs), cc.errs[:min(len(cc.errs), 10)])
	}
}

// waitProbe waits until the probe at addr answers.
func waitProbe(t *testing.T, ns, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cc := &churnClient{}
		cc.once(context.Background(), ns, addr, 0)
		if cc.ok == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe at %s never answered: %v", addr, cc.errs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

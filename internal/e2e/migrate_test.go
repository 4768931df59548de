package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
)

// nsDialer opens connections from inside a network namespace.
type nsDialer struct{ ns string }

func (d nsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := linux.InNetNS(d.ns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

type migResult struct {
	OK          bool               `json:"ok"`
	Error       string             `json:"error"`
	From        string             `json:"from"`
	To          string             `json:"to"`
	DowntimeMs  float64            `json:"downtime_ms"`
	TotalMs     float64            `json:"total_ms"`
	PhasesMs    map[string]float64 `json:"phases_ms"`
	BytesOnWire int64              `json:"bytes_on_wire"`
	// ForwardedConnections: connection requests held by the source and
	// forwarded to the destination.
	ForwardedConnections int `json:"forwarded_connections"`
	// ForwardedPackets: the other packets the source held from the
	// freeze on and forwarded.
	ForwardedPackets int       `json:"forwarded_packets"`
	Started          time.Time `json:"started"`
}

// liveClient keeps one probe connection busy (a request every period) and
// checks every reply; replies counts verified replies so a test can wait
// for the service to answer again.
type liveClient struct {
	replies atomic.Int64
	mu      sync.Mutex
	err     error
	maxGap  time.Duration
}

func (lc *liveClient) fail(err error) {
	lc.mu.Lock()
	if lc.err == nil {
		lc.err = err
	}
	lc.mu.Unlock()
}

func runLiveClient(ctx context.Context, wg *sync.WaitGroup, ns, addr string, period time.Duration) (*liveClient, error) {
	conn, err := nsDialer{ns}.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	lc := &liveClient{}
	var sent []byte
	var smu sync.Mutex
	wg.Add(2)
	go func() { // writer
		defer wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			line := []byte(fmt.Sprintf("req %d\n", i))
			smu.Lock()
			sent = append(sent, line...)
			smu.Unlock()
			if _, err := conn.Write(line); err != nil {
				if ctx.Err() == nil { // not the reader closing it at the end
					lc.fail(fmt.Errorf("write: %w", err))
				}
				return
			}
		}
	}()
	go func() { // reader
		defer wg.Done()
		defer conn.Close()
		go func() { <-ctx.Done(); conn.SetReadDeadline(time.Now()) }()
		r := bufio.NewReader(conn)
		var n int
		last := time.Now()
		for {
			reply, err := r.ReadString('\n')
			if err != nil {
				if ctx.Err() == nil {
					lc.fail(fmt.Errorf("read: %w", err))
				}
				return
			}
			now := time.Now()
			lc.mu.Lock()
			if g := now.Sub(last); g > lc.maxGap {
				lc.maxGap = g
			}
			lc.mu.Unlock()
			last = now
			// The reply covers everything up to some line end.
			var count int
			var crc uint32
			if _, err := fmt.Sscanf(reply, "%d %x", &count, &crc); err != nil {
				lc.fail(fmt.Errorf("bad reply %q", reply))
				return
			}
			smu.Lock()
			ok := count <= len(sent) && count > n && crc32.ChecksumIEEE(sent[:count]) == crc
			smu.Unlock()
			if !ok {
				lc.fail(fmt.Errorf("reply %q does not match what was sent", reply))
				return
			}
			n = count
			lc.replies.Add(1)
		}
	}()
	return lc, nil
}

// TestProbeSurvivesMigrations: a client holds one TCP connection to the
// continuity probe and keeps sending every 5 ms while the probe is migrated
// around three nodes; no reset, every reply's byte count and CRC match.
func TestProbeSurvivesMigrations(t *testing.T) {
	for _, strategy := range []string{"stop-and-copy", "post-copy", "pre-copy", "hybrid"} {
		t.Run(strategy, func(t *testing.T) { testProbeSurvivesMigrations(t, strategy) })
	}
}

// probeTestbed brings up three nodes and a client, with the continuity
// probe "p" on node0 answering on port 7000 (`run` returns once the
// container started, maybe before the probe listens).
func probeTestbed(t *testing.T) (*env, status, ctr) {
	t.Helper()
	e := newEnv(t)
	e.up("--nodes", "3", "--clients", "1")
	var st status
	e.mustJSON(&st, "testbed", "status", "--json")
	var c ctr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "p", "--image", "probe", "--json", "--", "7000")
	waitProbe(t, linux.NetNSPath(st.Clients[0].NetNS), net.JoinHostPort(c.IP, "7000"))
	return e, st, c
}

func testProbeSurvivesMigrations(t *testing.T, strategy string) {
	e, st, c := probeTestbed(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var clients []*liveClient
	for i := 0; i < 2; i++ {
		lc, err := runLiveClient(ctx, &wg, linux.NetNSPath(st.Clients[0].NetNS), net.JoinHostPort(c.IP, "7000"), 5*time.Millisecond)
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		clients = append(clients, lc)
	}
	// answering waits until every connection got fresh verified replies.
	answering := func(what string) {
		t.Helper()
		var base []int64
		for _, lc := range clients {
			base = append(base, lc.replies.Load())
		}
		deadline := time.Now().Add(20 * time.Second)
		for i, lc := range clients {
			for lc.replies.Load() < base[i]+5 {
				lc.mu.Lock()
				err := lc.err
				lc.mu.Unlock()
				if err != nil {
					t.Fatalf("%s: connection %d broke: %v", what, i, err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: connection %d got no replies for 20 s", what, i)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	answering("before migrations")

	const n = 20
	for i := 0; i < n; i++ {
		to := st.Nodes[(i+1)%3].Name
		var res migResult
		e.mustJSON(&res, "migrate", "p", "--to", to, "--strategy", strategy, "--json")
		if !res.OK || res.To != to {
			t.Fatalf("migration %d to %s: %+v", i, to, res)
		}
		if res.DowntimeMs <= 0 || res.BytesOnWire <= 0 || res.PhasesMs["dump"] <= 0 || res.PhasesMs["transfer"] <= 0 ||
			(strategy == "post-copy" || strategy == "hybrid") != hasPhase(res.PhasesMs, "lazy") ||
			(strategy == "pre-copy" || strategy == "hybrid") != (res.PhasesMs["precopy"] > 0) {
			t.Errorf("migration %d: implausible result %+v", i, res)
		}
		t.Logf("migration %d -> %s: downtime %.1f ms, phases %v", i, to, res.DowntimeMs, res.PhasesMs)
		answering(fmt.Sprintf("after migration %d", i))
	}
	for i, lc := range clients {
		lc.mu.Lock()
		t.Logf("connection %d: %d verified replies, longest gap %v", i, lc.replies.Load(), lc.maxGap)
		if lc.err != nil {
			t.Errorf("connection %d: %v", i, lc.err)
		}
		lc.mu.Unlock()
	}
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	want := st.Nodes[n%3].Name
	if len(ps) != 1 || ps[0].Node != want || ps[0].IP != c.IP {
		t.Fatalf("after %d migrations ps = %+v, want p on %s with IP %s", n, ps, want, c.IP)
	}
	checkMasks(t, ps[0].Pid)
}

// hasPhase says whether a migration went through phase. The lazy phase
// can last no time at all: the destination may have pulled every page
// before the source even committed.
func hasPhase(phases map[string]float64, phase string) bool {
	_, ok := phases[phase]
	return ok
}

// checkMasks checks that the container whose init is pid still sees its
// masked directories empty and cannot write into them (they travel as
// external mounts, runc.ExternalMasks).
func checkMasks(t *testing.T, pid int) {
	t.Helper()
	checked := 0
	for _, d := range runc.MaskedDirs {
		if _, err := os.Stat(d); err != nil {
			continue // not on this host: runc masks nothing there
		}
		in := fmt.Sprintf("/proc/%d/root%s", pid, d)
		ents, err := os.ReadDir(in)
		if err != nil || len(ents) != 0 {
			t.Errorf("masked %s: entries %d, err %v; want empty", d, len(ents), err)
		}
		if err := os.WriteFile(filepath.Join(in, "edgehop-probe"), nil, 0o644); err == nil {
			t.Errorf("masked %s: writable from the container's root", d)
		}
		checked++
	}
	if checked == 0 {
		t.Errorf("none of the masked directories %v exists on this host", runc.MaskedDirs)
	}
}

// TestDPRGenMemoryExact: DPRGen rewrites a fifth of its 64 MB state all
// the time while it is migrated with live rounds; after every migration
// it verifies its whole buffer against its seeded generator, asked on the
// connection the client opened before the first migration.
func TestDPRGenMemoryExact(t *testing.T) {
	for _, strategy := range []string{"pre-copy", "hybrid"} {
		t.Run(strategy, func(t *testing.T) { testDPRGenMemoryExact(t, strategy) })
	}
}

func testDPRGenMemoryExact(t *testing.T, strategy string) {
	e := newEnv(t)
	e.up("--nodes", "2", "--clients", "1", "--node-rate", "1gbit")
	var st status
	e.mustJSON(&st, "testbed", "status", "--json")
	var c ctr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "d", "--image", "dprgen", "--json", "--",
		"--state-mb", "64", "--dirty-fraction", "0.2", "--interval", "500ms")
	var conn net.Conn
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		conn, err = nsDialer{linux.NetNSPath(st.Clients[0].NetNS)}.DialContext(context.Background(), "tcp", net.JoinHostPort(c.IP, "7001"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dprgen not reachable: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	check := func(what string) {
		t.Helper()
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(conn, "check\n"); err != nil {
			t.Fatalf("%s: kept connection: %v", what, err)
		}
		line, err := rd.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "ok ") {
			t.Fatalf("%s: memory check = %q, %v", what, line, err)
		}
	}
	check("before migrating")
	for i, to := range []string{"node1", "node0", "node1"} {
		var res struct {
			migResult
			Precopy struct {
				Rounds        []json.RawMessage `json:"rounds"`
				DumpPages     int64             `json:"dump_pages"`
				HeldPages     int64             `json:"held_pages"`
				LazyHeldPages int64             `json:"lazy_held_pages"`
				LazyDataPages int64             `json:"lazy_data_pages"`
			} `json:"precopy"`
		}
		e.mustJSON(&res, "migrate", "d", "--to", to, "--strategy", strategy, "--json")
		if !res.OK || res.To != to {
			t.Fatalf("migration %d to %s: %+v", i, to, res)
		}
		// 64 MB at a fifth dirty: the rounds must have left most pages on
		// the destination, found in the final delta (pre-copy) or by the
		// lazy pages' proxy (hybrid).
		held, all := res.Precopy.HeldPages, res.Precopy.DumpPages
		if strategy == "hybrid" {
			held, all = res.Precopy.LazyHeldPages, res.Precopy.LazyHeldPages+res.Precopy.LazyDataPages
		}
		if len(res.Precopy.Rounds) == 0 || held*2 < all {
			t.Errorf("migration %d: rounds %d, held %d of %d pages", i, len(res.Precopy.Rounds), held, all)
		}
		t.Logf("migration %d -> %s: downtime %.1f ms, %d rounds, %d of %d pages held, %d bytes", i, to, res.DowntimeMs,
			len(res.Precopy.Rounds), held, all, res.BytesOnWire)
		check(fmt.Sprintf("after migration %d", i))
	}
}

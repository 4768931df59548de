package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testbed"
)

// The tests in this file run real services (redis, memcached, mosquitto
// from the services image) on node0 of a three-node testbed, keep client
// connections open from client0 while the service is migrated around the
// three nodes and back to node0, and check that nothing the clients did
// was lost: the same connections answer afterwards, with all the data.

const servicesMigrations = 3 // node0 → node1 → node2 → node0

// strategies are the migration strategies every service test runs with,
// each on a testbed of its own.
var strategies = []string{"stop-and-copy", "post-copy", "pre-copy"}

// forEachStrategy runs test as one subtest per strategy.
func forEachStrategy(t *testing.T, test func(t *testing.T, strategy string)) {
	for _, s := range strategies {
		t.Run(s, func(t *testing.T) { test(t, s) })
	}
}

// servicesTestbed brings up three nodes and one client whose link is
// 1 Gbit/s, so that filling a service is quick.
func servicesTestbed(e *env) *testbed.State {
	e.t.Helper()
	spec := testbed.DefaultSpec(e.name, 3, 1)
	spec.Clients[0].Link.RateBps = 1_000_000_000
	st := e.upAPI(spec, testbed.Options{})
	e.logsOnFailure(st)
	return st
}

// logsOnFailure logs the tails of the nodes' agent logs, the containers'
// output and any CRIU logs left in the scratch dirs when the test fails,
// before the testbed is torn down (cleanups run last registered first).
func (e *env) logsOnFailure(st *testbed.State) {
	e.t.Cleanup(func() {
		if !e.t.Failed() {
			return
		}
		for _, n := range st.Nodes {
			var files []string
			for _, g := range []string{"agent.log", "containers/*/output.log", "scratch/*/*.log"} {
				m, _ := filepath.Glob(filepath.Join(n.StateDir, g))
				files = append(files, m...)
			}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					continue
				}
				e.t.Logf("%s %s (last lines):\n%s", n.Name, strings.TrimPrefix(f, n.StateDir+"/"), lastLines(string(b), 30))
			}
		}
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// serviceMig is what migrate --json reports, with the fields these tests
// log besides migResult's.
type serviceMig struct {
	migResult
	StateBytes  int64 `json:"state_bytes"`
	HeldPackets int   `json:"held_packets"`
}

// migrateOK migrates name to node to with strategy and fails the test
// unless the migration reports success with a plausible result (pages
// served lazily exactly when the strategy is post-copy).
func (e *env) migrateOK(name, to, strategy string) serviceMig {
	e.t.Helper()
	var res serviceMig
	e.mustJSON(&res, "migrate", name, "--to", to, "--strategy", strategy, "--json")
	if !res.OK || res.To != to {
		e.t.Fatalf("migrate %s to %s: %+v", name, to, res)
	}
	lazy := strategy == "post-copy" || strategy == "hybrid"
	if res.DowntimeMs <= 0 || res.BytesOnWire <= 0 || lazy != hasPhase(res.PhasesMs, "lazy") {
		e.t.Errorf("migrate %s to %s (%s): implausible result %+v", name, to, strategy, res)
	}
	return res
}

// requireOn checks that ps shows exactly name, on node, with address ip.
func (e *env) requireOn(name, node, ip string) {
	e.t.Helper()
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	if len(ps) != 1 || ps[0].Name != name || ps[0].Node != node || ps[0].IP != ip {
		e.t.Fatalf("ps = %+v, want only %s on %s with IP %s", ps, name, node, ip)
	}
}

// requireNonRoot fails the test unless every process of container name
// runs as a user other than root, so that a test meant to migrate a
// non-root service really does.
func (e *env) requireNonRoot(name string) {
	e.t.Helper()
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	for _, c := range ps {
		if c.Name != name {
			continue
		}
		if c.Pid <= 0 {
			e.t.Fatalf("%s has no pid: %+v", name, c)
		}
		pids, err := linux.ProcessTree(c.Pid)
		if err != nil {
			e.t.Fatal(err)
		}
		var users []int
		for _, pid := range pids {
			u, err := linux.ProcessUIDs(pid)
			if err != nil {
				continue
			}
			users = append(users, u[0])
			if u[0] == 0 || u[1] == 0 {
				e.t.Fatalf("%s's process %d runs as root (uids %v), want a non-root service", name, pid, u)
			}
		}
		e.t.Logf("%s runs as uids %v", name, users)
		return
	}
	e.t.Fatalf("%s not listed", name)
}

// runService starts a container from the services image on node0 and
// returns its overlay address.
func (e *env) runService(name string, args ...string) string {
	e.t.Helper()
	var c ctr
	e.mustJSON(&c, append([]string{"run", "--node", "node0", "--name", name, "--image", "services", "--json", "--"}, args...)...)
	if c.IP == "" {
		e.t.Fatalf("run %s: no IP in %+v", name, c)
	}
	return c.IP
}

// warmImage has node1 and node2 unpack the services image in the
// background (a container started and removed), so that the migrations'
// prepare phase does not: it saves test time only, the downtime does not
// include the prepare phase. The returned func waits and fails the test
// if the warm-up failed.
func (e *env) warmImage(st *testbed.State) func() {
	var wg sync.WaitGroup
	errs := make([]error, len(st.Nodes))
	for k, n := range st.Nodes[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "warm" + n.Name
			if _, stderr, err := e.run("run", "--node", n.Name, "--name", name, "--image", "services", "--", "sleep", "600"); err != nil {
				errs[k] = fmt.Errorf("run on %s: %v: %s", n.Name, err, stderr)
				return
			}
			if _, stderr, err := e.run("rm", name); err != nil {
				errs[k] = fmt.Errorf("rm on %s: %v: %s", n.Name, err, stderr)
			}
		}()
	}
	e.t.Cleanup(wg.Wait) // before the testbed goes down
	return func() {
		e.t.Helper()
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				e.t.Fatalf("warm up the services image: %v", err)
			}
		}
	}
}

// liveOps runs one operation after another on a kept connection until
// stopped, so the service is in use while it is migrated. Each operation
// checks its own reply; the first failure ends the loop. The longest time
// between two completed operations is what the client saw of the
// downtime.
type liveOps struct {
	done   atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex // guards err and maxGap
	err    error
	maxGap time.Duration
}

// startLive runs op(0), op(1), … in a goroutine owned by the returned
// liveOps; stop waits for it.
func startLive(op func(i int64) error) *liveOps {
	ctx, cancel := context.WithCancel(context.Background())
	l := &liveOps{cancel: cancel}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		last := time.Now()
		for i := int64(0); ctx.Err() == nil; i++ {
			if err := op(i); err != nil {
				l.mu.Lock()
				l.err = fmt.Errorf("operation %d: %w", i, err)
				l.mu.Unlock()
				return
			}
			now := time.Now()
			l.mu.Lock()
			l.maxGap = max(l.maxGap, now.Sub(last))
			l.mu.Unlock()
			last = now
			l.done.Add(1)
		}
	}()
	return l
}

func (l *liveOps) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// waitProgress waits until k more operations completed than when it was
// called: the kept connection answers again.
func (l *liveOps) waitProgress(t *testing.T, k int64, what string) {
	t.Helper()
	base := l.done.Load()
	deadline := time.Now().Add(20 * time.Second)
	for l.done.Load() < base+k {
		if err := l.failure(); err != nil {
			t.Fatalf("%s: the kept connection failed: %v", what, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no answer on the kept connection for 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop ends the loop and returns how many operations completed, the
// longest gap and the loop's failure.
func (l *liveOps) stop() (int64, time.Duration, error) {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done.Load(), l.maxGap, l.err
}

// TestRedisMigration, for each strategy: redis holding ~200 MB is migrated
// three times while a client, connected before the first migration, keeps
// incrementing a counter on its connection; after each migration every
// key is intact when read through that same connection, the counter holds
// exactly the increments the client saw acknowledged, and a new
// connection works too.
func TestRedisMigration(t *testing.T) { forEachStrategy(t, testRedisMigration) }

func testRedisMigration(t *testing.T, strategy string) {
	e := newEnv(t)
	st := servicesTestbed(e)
	warmed := e.warmImage(st)
	const n, size = 200_000, 1000
	addr, rc := e.redisWithData(st, 0, size)
	ip, _, _ := net.SplitHostPort(addr)
	start := time.Now()
	if err := rc.streamFill(n, size); err != nil {
		t.Fatalf("fill redis: %v", err)
	}
	t.Logf("filled %d keys of %d B in %v", n, size, time.Since(start).Round(time.Millisecond))
	warmed()

	// The counter lives in database 1 so database 0 holds exactly the
	// filled keys (streamVerify checks DBSIZE).
	var incrs int64
	incr := func(int64) error {
		got, err := rc.do("INCR", "ctr")
		if err != nil {
			return err
		}
		if want := strconv.FormatInt(incrs+1, 10); got != want {
			return fmt.Errorf("INCR = %s, want %s (a write lost or applied twice)", got, want)
		}
		incrs++
		return nil
	}
	selectDB := func(db string) {
		t.Helper()
		if got, err := rc.do("SELECT", db); err != nil || got != "OK" {
			t.Fatalf("SELECT %s on the kept connection: %q, %v", db, got, err)
		}
	}
	var live *liveOps
	defer func() { // on failure: the loop ends before the connection is closed
		if live != nil {
			live.stop()
		}
	}()
	for i := 0; i < servicesMigrations; i++ {
		to := st.Nodes[(i+1)%3].Name
		selectDB("1")
		live = startLive(incr)
		live.waitProgress(t, 3, "before migration")
		res := e.migrateOK("redis", to, strategy)
		live.waitProgress(t, 3, fmt.Sprintf("after migration %d", i))
		ops, gap, err := live.stop()
		if err != nil {
			t.Fatalf("migration %d: the kept connection: %v", i, err)
		}
		t.Logf("migration %d -> %s: downtime %.1f ms (client saw %v), total %.1f ms, state %d B, held packets %d, phases %v; %d INCRs on the kept connection",
			i, to, res.DowntimeMs, gap.Round(time.Millisecond), res.TotalMs, res.StateBytes, res.HeldPackets, res.PhasesMs, ops)

		selectDB("0")
		vstart := time.Now()
		if err := rc.streamVerify(n, size); err != nil {
			t.Fatalf("after migration %d, through the kept connection: %v", i, err)
		}
		t.Logf("after migration %d: %d keys verified on the kept connection in %v", i, n, time.Since(vstart).Round(time.Millisecond))

		// A new connection reaches the service on its new node.
		rc2, err := dialRedis(st.Clients[0].NetNSPath, addr)
		if err != nil {
			t.Fatalf("after migration %d: new connection: %v", i, err)
		}
		for _, k := range []int{0, n / 2, n - 1} {
			v, err := rc2.do("GET", fmt.Sprintf("k%d", k))
			if err != nil || v != value(k, size) {
				rc2.Close()
				t.Fatalf("after migration %d: new connection GET k%d: wrong value or %v", i, k, err)
			}
		}
		rc2.Close()
	}
	e.requireOn("redis", "node0", ip)

	selectDB("1")
	if got, err := rc.do("GET", "ctr"); err != nil || got != strconv.FormatInt(incrs, 10) {
		t.Errorf("counter = %q (%v), want %d acknowledged INCRs", got, err, incrs)
	}
	info, err := rc.do("INFO", "memory")
	if err != nil {
		t.Fatalf("INFO memory: %v", err)
	}
	used := infoField(info, "used_memory")
	t.Logf("used_memory after %d migrations: %d B", servicesMigrations, used)
	if used < 190_000_000 {
		t.Errorf("used_memory = %d B after the migrations, want ≥ 190 MB", used)
	}
}

// pipeline sends n commands, written by cmd, in batches with at most
// four batches unanswered, while check reads and checks the replies in
// order from the same connection: both directions stay busy, which keeps
// filling and checking hundreds of megabytes quick.
func pipeline(c net.Conn, n, batch int, cmd func(b []byte, i int) []byte, check func(i int) error) error {
	const window = 4
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	defer c.SetDeadline(time.Time{})
	sent := make(chan int, window) // end of each batch written
	done := make(chan struct{})
	werr := make(chan error, 1)
	go func() { // writer, waited for through werr
		defer close(sent)
		var b []byte
		for i := 0; i < n; i += batch {
			b = b[:0]
			end := min(i+batch, n)
			for j := i; j < end; j++ {
				b = cmd(b, j)
			}
			select {
			case sent <- end:
			case <-done:
				werr <- nil
				return
			}
			if _, err := c.Write(b); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	var rerr error
	i := 0
	for end := range sent {
		for ; i < end && rerr == nil; i++ {
			rerr = check(i)
		}
		if rerr != nil {
			break
		}
	}
	close(done)
	if rerr != nil {
		c.SetDeadline(time.Now()) // unblock a writer stuck on a full window
	}
	for range sent {
	}
	if err := <-werr; rerr == nil {
		rerr = err
	}
	return rerr
}

// valueInto appends value(i, size) to b without allocating.
func valueInto(b []byte, i, size int) []byte {
	b = append(b, 'v')
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, '-')
	c := byte('a' + i%26)
	for len(b) < size {
		b = append(b, c)
	}
	return b
}

// streamFill is fill with the connection kept busy in both directions.
func (rc *redisConn) streamFill(n, size int) error {
	var v []byte
	return pipeline(rc.c, n, 1000, func(b []byte, i int) []byte {
		v = valueInto(v[:0], i, size)
		b = fmt.Appendf(b, "*3\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$%d\r\n", len(strconv.Itoa(i))+1, i, len(v))
		b = append(b, v...)
		return append(b, "\r\n"...)
	}, func(i int) error {
		line, err := rc.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if string(line) != "+OK\r\n" {
			return fmt.Errorf("SET k%d: %q", i, line)
		}
		return nil
	})
}

// streamVerify is verify (the key count and every value) with the
// connection kept busy in both directions.
func (rc *redisConn) streamVerify(n, size int) error {
	got, err := rc.do("DBSIZE")
	if err != nil {
		return err
	}
	if got != strconv.Itoa(n) {
		return fmt.Errorf("DBSIZE = %s, want %d", got, n)
	}
	var want []byte
	buf := make([]byte, size+2)
	header := []byte(fmt.Sprintf("$%d\r\n", size))
	return pipeline(rc.c, n, 1000, func(b []byte, i int) []byte {
		return fmt.Appendf(b, "*2\r\n$3\r\nGET\r\n$%d\r\nk%d\r\n", len(strconv.Itoa(i))+1, i)
	}, func(i int) error {
		line, err := rc.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if !bytes.Equal(line, header) {
			return fmt.Errorf("GET k%d: reply %q, want a %d-byte value", i, line, size)
		}
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return err
		}
		if want = valueInto(want[:0], i, size); !bytes.Equal(buf[:size], want) {
			return fmt.Errorf("key k%d has a wrong value", i)
		}
		return nil
	})
}

// infoField returns an integer field of redis' INFO output (-1 if absent).
func infoField(info, name string) int64 {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// mcConn is a minimal memcached text-protocol client for tests.
type mcConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialMemcached(ns, addr string) (*mcConn, error) {
	c, err := nsDialer{ns}.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &mcConn{c: c, r: bufio.NewReaderSize(c, 1<<20)}, nil
}

func (mc *mcConn) Close() error { return mc.c.Close() }

func (mc *mcConn) line() (string, error) {
	s, err := mc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(s, "\r\n"), nil
}

// cmd sends one command line and returns the first reply line.
func (mc *mcConn) cmd(s string) (string, error) {
	mc.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(mc.c, s+"\r\n"); err != nil {
		return "", err
	}
	return mc.line()
}

// fill stores n keys of size bytes.
func (mc *mcConn) fill(n, size int) error {
	var v []byte
	return pipeline(mc.c, n, 500, func(b []byte, i int) []byte {
		v = valueInto(v[:0], i, size)
		b = fmt.Appendf(b, "set k%d 0 0 %d\r\n", i, len(v))
		b = append(b, v...)
		return append(b, "\r\n"...)
	}, func(i int) error {
		l, err := mc.line()
		if err != nil {
			return err
		}
		if l != "STORED" {
			return fmt.Errorf("set k%d: %q", i, l)
		}
		return nil
	})
}

// verify reads every key with multi-key gets of 100 keys and checks each
// value.
func (mc *mcConn) verify(n, size int) error {
	const perGet = 100
	var want []byte
	return pipeline(mc.c, (n+perGet-1)/perGet, 10, func(b []byte, g int) []byte {
		b = append(b, "get"...)
		for j := g * perGet; j < min((g+1)*perGet, n); j++ {
			b = fmt.Appendf(b, " k%d", j)
		}
		return append(b, "\r\n"...)
	}, func(g int) error {
		// memcached answers a multi-key get in the order asked.
		for j := g * perGet; ; j++ {
			l, err := mc.line()
			if err != nil {
				return err
			}
			if l == "END" {
				if j != min((g+1)*perGet, n) {
					return fmt.Errorf("key k%d is missing", j)
				}
				return nil
			}
			var key string
			var flags, nb int
			if _, err := fmt.Sscanf(l, "VALUE %s %d %d", &key, &flags, &nb); err != nil {
				return fmt.Errorf("get: unexpected line %q", l)
			}
			if key != "k"+strconv.Itoa(j) {
				return fmt.Errorf("get: got %s where k%d was due (missing or out of order)", key, j)
			}
			buf := make([]byte, nb+2)
			if _, err := io.ReadFull(mc.r, buf); err != nil {
				return err
			}
			if want = valueInto(want[:0], j, size); !bytes.Equal(buf[:nb], want) {
				return fmt.Errorf("key %s has a wrong value", key)
			}
		}
	})
}

// memcachedReady connects once memcached answers; the connection is
// closed on cleanup.
func memcachedReady(t *testing.T, ns, addr string) *mcConn {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mc, err := dialMemcached(ns, addr)
		if err == nil {
			var v string
			if v, err = mc.cmd("version"); err == nil && strings.HasPrefix(v, "VERSION ") {
				t.Cleanup(func() { mc.Close() })
				return mc
			}
			mc.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached not answering: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stats returns memcached's general statistics.
func (mc *mcConn) stats() (map[string]string, error) {
	l, err := mc.cmd("stats")
	out := map[string]string{}
	for ; err == nil && l != "END"; l, err = mc.line() {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "STAT" {
			return nil, fmt.Errorf("stats: unexpected line %q", l)
		}
		out[f[1]] = f[2]
	}
	return out, err
}

// TestMemcachedMigration, for each strategy: memcached holding ~50 MB is
// migrated three times while a client, connected before, keeps
// incrementing a counter on its connection; after each migration every
// value is intact when read through that same connection and a new
// connection works too.
func TestMemcachedMigration(t *testing.T) { forEachStrategy(t, testMemcachedMigration) }

func testMemcachedMigration(t *testing.T, strategy string) {
	e := newEnv(t)
	st := servicesTestbed(e)
	warmed := e.warmImage(st)
	// As memcached is usually run: dropping its privileges to nobody.
	ip := e.runService("mc", "memcached", "-u", "nobody", "-l", "0.0.0.0", "-p", "11211", "-m", "512")
	addr := net.JoinHostPort(ip, "11211")
	ns := st.Clients[0].NetNSPath

	mc := memcachedReady(t, ns, addr)
	e.requireNonRoot("mc")

	const n, size = 50_000, 1000
	start := time.Now()
	if err := mc.fill(n, size); err != nil {
		t.Fatalf("fill memcached: %v", err)
	}
	t.Logf("filled %d keys of %d B in %v", n, size, time.Since(start).Round(time.Millisecond))
	warmed()
	if l, err := mc.cmd("set ctr 0 0 1\r\n0"); err != nil || l != "STORED" {
		t.Fatalf("set ctr: %q, %v", l, err)
	}
	var incrs int64
	incr := func(int64) error {
		got, err := mc.cmd("incr ctr 1")
		if err != nil {
			return err
		}
		if want := strconv.FormatInt(incrs+1, 10); got != want {
			return fmt.Errorf("incr = %q, want %s (a write lost or applied twice)", got, want)
		}
		incrs++
		return nil
	}

	var live *liveOps
	defer func() { // on failure: the loop ends before the connection is closed
		if live != nil {
			live.stop()
		}
	}()
	for i := 0; i < servicesMigrations; i++ {
		to := st.Nodes[(i+1)%3].Name
		live = startLive(incr)
		live.waitProgress(t, 3, "before migration")
		res := e.migrateOK("mc", to, strategy)
		live.waitProgress(t, 3, fmt.Sprintf("after migration %d", i))
		ops, gap, err := live.stop()
		if err != nil {
			t.Fatalf("migration %d: the kept connection: %v", i, err)
		}
		t.Logf("migration %d -> %s: downtime %.1f ms (client saw %v), total %.1f ms, state %d B, held packets %d, phases %v; %d incrs on the kept connection",
			i, to, res.DowntimeMs, gap.Round(time.Millisecond), res.TotalMs, res.StateBytes, res.HeldPackets, res.PhasesMs, ops)

		vstart := time.Now()
		if err := mc.verify(n, size); err != nil {
			t.Fatalf("after migration %d, through the kept connection: %v", i, err)
		}
		t.Logf("after migration %d: %d keys verified on the kept connection in %v", i, n, time.Since(vstart).Round(time.Millisecond))
		mc2, err := dialMemcached(ns, addr)
		if err != nil {
			t.Fatalf("after migration %d: new connection: %v", i, err)
		}
		l, err := mc2.cmd("get k7")
		want := fmt.Sprintf("VALUE k7 0 %d", size)
		mc2.Close()
		if err != nil || l != want {
			t.Fatalf("after migration %d: new connection get k7: %q, %v", i, l, err)
		}
	}
	e.requireOn("mc", "node0", ip)

	if got, err := mc.cmd("incr ctr 0"); err != nil || got != strconv.FormatInt(incrs, 10) {
		t.Errorf("counter = %q (%v), want %d acknowledged incrs", got, err, incrs)
	}
	stats, err := mc.stats()
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	t.Logf("memcached after %d migrations: curr_items %s, bytes %s, evictions %s, curr_connections %s",
		servicesMigrations, stats["curr_items"], stats["bytes"], stats["evictions"], stats["curr_connections"])
	if stats["curr_items"] != strconv.Itoa(n+1) || stats["evictions"] != "0" {
		t.Errorf("curr_items = %s, evictions = %s; want %d and 0", stats["curr_items"], stats["evictions"], n+1)
	}
	// node0 was the source of the first migration and the destination of
	// the last: its metrics count both.
	out, _, err := e.run("metrics", "--node", "node0")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	for _, want := range []string{
		fmt.Sprintf(`edgehop_migrations_total{outcome="ok",role="source",strategy=%q} 1`, strategy),
		fmt.Sprintf(`edgehop_migrations_total{outcome="ok",role="destination",strategy=%q} 1`, strategy),
		fmt.Sprintf(`edgehop_migration_downtime_seconds_count{strategy=%q} 1`, strategy),
		"edgehop_containers 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("node0's metrics lack %q", want)
		}
	}
}

// mqttClient is a paho client whose connection is opened from inside a
// client namespace, with automatic reconnection off: a connection lost
// during a migration shows up in lost and is never hidden by a
// reconnect.
type mqttClient struct {
	c        mqtt.Client
	connects atomic.Int64
	lost     atomic.Int64
	lostErr  atomic.Pointer[error]
}

func connectMQTT(t *testing.T, ns, addr, id string) *mqttClient {
	t.Helper()
	mc := &mqttClient{}
	opts := mqtt.NewClientOptions().
		AddBroker("tcp://" + addr).
		SetClientID(id).
		// Clean sessions: the broker keeps nothing for a client that
		// comes back, so only the kept connection and the migrated
		// broker's memory can deliver every message.
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetKeepAlive(30 * time.Second).
		SetOrderMatters(true).
		SetConnectTimeout(10 * time.Second).
		SetOnConnectHandler(func(mqtt.Client) { mc.connects.Add(1) }).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			mc.lost.Add(1)
			mc.lostErr.Store(&err)
		}).
		SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			return nsDialer{ns}.DialContext(context.Background(), "tcp", u.Host)
		})
	mc.c = mqtt.NewClient(opts)
	deadline := time.Now().Add(20 * time.Second)
	for {
		tok := mc.c.Connect()
		if !tok.WaitTimeout(15 * time.Second) {
			t.Fatalf("mqtt %s: connect timed out", id)
		}
		if tok.Error() == nil {
			return mc
		}
		if time.Now().After(deadline) {
			t.Fatalf("mqtt %s: connect: %v", id, tok.Error())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check fails the test if the client lost its connection or reconnected.
func (mc *mqttClient) check(t *testing.T, who string) {
	t.Helper()
	if n := mc.lost.Load(); n != 0 {
		t.Errorf("%s lost its connection %d times (last: %v)", who, n, *mc.lostErr.Load())
	}
	if n := mc.connects.Load(); n != 1 {
		t.Errorf("%s connected %d times, want 1", who, n)
	}
}

// arrivals records what a subscriber got: sequence numbers and times.
type arrivals struct {
	mu   sync.Mutex // guards seqs, at and bad
	seqs []int
	at   []time.Time
	bad  []string
}

func (a *arrivals) add(m mqtt.Message) {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	n, err := strconv.Atoi(string(m.Payload()))
	if err != nil {
		a.bad = append(a.bad, string(m.Payload()))
		return
	}
	a.seqs = append(a.seqs, n)
	a.at = append(a.at, now)
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.seqs)
}

// maxGapSince returns the longest time between two arrivals from index
// i on (the delivery gap a subscriber saw during a migration).
func (a *arrivals) maxGapSince(i int) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	var g time.Duration
	for j := max(i, 1); j < len(a.at); j++ {
		g = max(g, a.at[j].Sub(a.at[j-1]))
	}
	return g
}

// TestMosquittoQoS2Migration, for each strategy: a QoS 2 publisher sends a
// numbered message every 10 ms to a QoS 2 subscriber through mosquitto
// while the broker is migrated three times; the subscriber gets every
// number exactly once and in order, every publish completes its QoS 2
// handshake, and neither client's connection is lost.
func TestMosquittoQoS2Migration(t *testing.T) { forEachStrategy(t, testMosquittoQoS2Migration) }

func testMosquittoQoS2Migration(t *testing.T, strategy string) {
	e := newEnv(t)
	st := servicesTestbed(e)
	warmed := e.warmImage(st)
	// Debian's configuration as packaged (pid file, persistence, log
	// file, the broker dropping to user mosquitto) plus the image's
	// conf.d listener on every address.
	ip := e.runService("mq", "mosquitto", "-c", "/etc/mosquitto/mosquitto.conf")
	addr := net.JoinHostPort(ip, "1883")
	ns := st.Clients[0].NetNSPath
	topic := "edgehop/" + e.name + "/seq"

	var got arrivals
	sub := connectMQTT(t, ns, addr, "sub-"+e.name)
	e.requireNonRoot("mq")
	defer sub.c.Disconnect(250)
	if tok := sub.c.Subscribe(topic, 2, func(_ mqtt.Client, m mqtt.Message) { got.add(m) }); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	pub := connectMQTT(t, ns, addr, "pub-"+e.name)
	defer pub.c.Disconnect(250)

	// The publisher: one message every 10 ms until stopped, with at most
	// pubWindow QoS 2 flows open. The window is the client's part of the
	// protocol: mosquitto 2.0 drops incoming QoS 2 messages beyond its
	// inflight quota (max_inflight_messages, 20) yet answers an MQTT 3.1.1
	// client with an ordinary PUBREC (its log shows "rc151", quota
	// exceeded), so a client without a window loses messages silently
	// whenever acknowledgements lag, migration or not. Its tokens are
	// read only after wg.Wait.
	const pubWindow = 10
	ctx, stopPub := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stopPub(); wg.Wait() }()
	var tokens []mqtt.Token
	var published atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if k := len(tokens) - pubWindow; k >= 0 {
				for !tokens[k].WaitTimeout(50 * time.Millisecond) {
					if ctx.Err() != nil {
						return
					}
				}
			}
			tokens = append(tokens, pub.c.Publish(topic, 2, false, strconv.Itoa(seq)))
			published.Add(1)
		}
	}()
	// progress waits until the subscriber got k more messages.
	progress := func(k int, what string) {
		t.Helper()
		base := got.count()
		deadline := time.Now().Add(20 * time.Second)
		for got.count() < base+k {
			if sub.lost.Load() != 0 || pub.lost.Load() != 0 {
				stopPub()
				wg.Wait()
				sub.check(t, "subscriber")
				pub.check(t, "publisher")
				t.FailNow()
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the subscriber got no messages for 20 s (%d so far, %d published)", what, got.count(), published.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	progress(50, "before migrations")
	warmed()

	for i := 0; i < servicesMigrations; i++ {
		to := st.Nodes[(i+1)%3].Name
		from, pubFrom := got.count(), published.Load()
		res := e.migrateOK("mq", to, strategy)
		pubTo := published.Load()
		progress(50, fmt.Sprintf("after migration %d", i))
		t.Logf("migration %d -> %s: downtime %.1f ms (subscriber saw %v between deliveries), total %.1f ms, state %d B, held packets %d, phases %v; messages %d-%d published meanwhile",
			i, to, res.DowntimeMs, got.maxGapSince(from).Round(time.Millisecond), res.TotalMs, res.StateBytes, res.HeldPackets, res.PhasesMs, pubFrom, pubTo-1)
	}
	stopPub()
	wg.Wait()
	e.requireOn("mq", "node0", ip)

	deadline := time.Now().Add(30 * time.Second)
	for i, tok := range tokens {
		if !tok.WaitTimeout(time.Until(deadline)) {
			t.Fatalf("publish %d: QoS 2 handshake not complete after 30 s", i)
		}
		if err := tok.Error(); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	n := int(published.Load())
	for got.count() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	sub.check(t, "subscriber")
	pub.check(t, "publisher")

	got.mu.Lock()
	defer got.mu.Unlock()
	t.Logf("%d messages published, %d delivered", n, len(got.seqs))
	if len(got.bad) != 0 {
		t.Errorf("%d malformed messages, e.g. %q", len(got.bad), got.bad[0])
	}
	var jumps []string
	for k := 1; k < len(got.seqs); k++ {
		if d := got.seqs[k] - got.seqs[k-1]; d != 1 && len(jumps) < 10 {
			jumps = append(jumps, fmt.Sprintf("%d→%d at %s", got.seqs[k-1], got.seqs[k], got.at[k].Format("15:04:05.000")))
		}
	}
	seen := make(map[int]int, n)
	var outOfOrder int
	for i, s := range got.seqs {
		seen[s]++
		if s != i {
			outOfOrder++
		}
	}
	var missing, dup []int
	for s := 0; s < n; s++ {
		switch c := seen[s]; {
		case c == 0:
			missing = append(missing, s)
		case c > 1:
			dup = append(dup, s)
		}
	}
	if len(missing) != 0 || len(dup) != 0 || outOfOrder != 0 || len(got.seqs) != n {
		t.Errorf("subscriber got %d messages for %d published: %d missing (first %v), %d duplicated (first %v), %d out of place; jumps %v",
			len(got.seqs), n, len(missing), head(missing, 10), len(dup), head(dup, 10), outOfOrder, jumps)
	}
}

func head(s []int, n int) []int {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// TestMixedUsersMigrate: a service whose processes run as different
// users (a root shell with memcached as nobody, as a root master with
// unprivileged workers) migrates with each strategy where root lacks
// CAP_SYS_RESOURCE: CRIU reads the rlimits the kernel refuses it through
// the shim's gate library. Its client connection and data are kept, and
// after every migration the shell still runs as root and memcached as
// nobody.
func TestMixedUsersMigrate(t *testing.T) {
	if ok, err := linux.HasCapSysResource(); err != nil || ok {
		t.Skipf("root holds CAP_SYS_RESOURCE here (%v): CRIU reads every rlimit itself, nothing to show", err)
	}
	e := newEnv(t)
	st := servicesTestbed(e)
	ip := e.runService("mc", "sh", "-c", "memcached -u nobody -l 0.0.0.0 -p 11211 -m 64 & wait")
	addr := net.JoinHostPort(ip, "11211")
	ns := st.Clients[0].NetNSPath
	mc := memcachedReady(t, ns, addr)
	const n, size = 200, 1000
	if err := mc.fill(n, size); err != nil {
		t.Fatalf("fill memcached: %v", err)
	}
	users := func(when string) {
		t.Helper()
		var ps []ctr
		e.mustJSON(&ps, "ps", "--json")
		if len(ps) != 1 || ps[0].Pid <= 0 {
			t.Fatalf("%s: ps = %+v", when, ps)
		}
		pids, err := linux.ProcessTree(ps[0].Pid)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for _, pid := range pids {
			if u, err := linux.ProcessUIDs(pid); err == nil {
				seen[u[0]] = true
			}
		}
		if !seen[0] || !seen[65534] || len(seen) != 2 {
			t.Fatalf("%s: the service's processes run as uids %v, want root and nobody", when, seen)
		}
	}
	users("before")
	for i, s := range strategies {
		to := fmt.Sprintf("node%d", (i+1)%3)
		res := e.migrateOK("mc", to, s)
		t.Logf("%s to %s: downtime %.1f ms", s, to, res.DowntimeMs)
		mc.c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := mc.verify(n, size); err != nil {
			t.Fatalf("after %s to %s: kept connection: %v", s, to, err)
		}
		users("after " + s)
		e.requireOn("mc", to, ip)
	}
}

// TestWritableLayerMigrates: a shell service appends a numbered line to
// a file every few milliseconds, keeps a rolling set of small files, and
// every 100 lines checks the file's line count and the set against its
// own counter; another rewrites one file with its counter and checks,
// before each write, that the file holds what it last wrote. Both are
// migrated with pre-copy (the writable layer goes live, then only the
// changes while frozen) there and back, then with stop-and-copy there and
// back (the layer goes live too). Each time the destination's restore
// starts on the live layer: the first service's files come and go, so its
// restore starts again on the delta; the second's one file is rewritten
// in place. A third writes its counter into one of 48 blocks of a 4 MiB
// file of random bytes in turn, and checks before each write that the
// block holds what it wrote there 48 turns before: that file changes in
// part, so it crosses in the frozen window as its changed blocks.
// Afterwards all three must keep reporting "ok", never "BAD".
func TestWritableLayerMigrates(t *testing.T) {
	e := newEnv(t)
	servicesTestbed(e)
	const script = `i=0; mkdir -p /w; while :; do i=$((i+1)); echo $i >> /w/log; echo $i > /w/f$i; rm -f /w/f$((i-20));
if [ $((i % 100)) = 0 ]; then n=$(wc -l < /w/log); m=$(ls /w | grep -c '^f'); if [ "$n" = "$i" ] && [ "$m" = 20 ]; then echo "ok $i"; else echo "BAD $i lines=$n files=$m"; fi; fi; sleep 0.005; done`
	const rewrite = `i=0; echo 0 > /c; while :; do j=$(cat /c); if [ "$j" != "$i" ]; then echo "BAD $i file=$j"; fi; i=$((i+1)); echo $i > /c;
if [ $((i % 100)) = 0 ]; then echo "ok $i"; fi; sleep 0.005; done`
	const blocks = `head -c 4194304 /dev/urandom > /big; i=0; while :; do i=$((i+1)); o=$(( (i % 48) * 65536 + 100 ));
if [ $i -gt 48 ]; then v=$(dd if=/big bs=1 skip=$o count=8 2>/dev/null); if [ "$v" != "$(printf %08d $((i-48)))" ]; then echo "BAD $i at $o: $v"; fi; fi;
printf %08d $i | dd of=/big bs=1 seek=$o conv=notrunc 2>/dev/null;
if [ $((i % 100)) = 0 ]; then n=$(wc -c < /big); if [ "$n" = 4194304 ]; then echo "ok $i"; else echo "BAD $i size $n"; fi; fi; sleep 0.005; done`
	e.runService("w", "sh", "-c", script)
	e.runService("c", "sh", "-c", rewrite)
	e.runService("p", "sh", "-c", blocks)
	waitLog := func(name, what string, after int) int {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			out, _, _ := e.run("logs", name)
			last := 0
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "BAD") {
					t.Fatalf("%s: %s found its files wrong: %s", what, name, l)
				}
				if v, ok := strings.CutPrefix(l, "ok "); ok {
					last, _ = strconv.Atoi(v)
				}
			}
			if last > after {
				return last
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("%s: no new ok line from %s after %d", what, name, after)
		return 0
	}
	seen := map[string]int{"w": waitLog("w", "before migrating", 200), "c": waitLog("c", "before migrating", 200), "p": waitLog("p", "before migrating", 100)}
	live := map[string][]string{}
	for i, m := range []struct{ strategy, to string }{{"pre-copy", "node1"}, {"pre-copy", "node0"}, {"stop-and-copy", "node1"}, {"stop-and-copy", "node0"}} {
		for _, name := range []string{"w", "c", "p"} {
			var res struct {
				serviceMig
				LayerPatched    int   `json:"layer_patched"`
				LayerPatchBytes int64 `json:"layer_patch_bytes"`
				ImagesEarly     int   `json:"images_early"`
				Precopy         struct {
					LayerBytes   int64 `json:"layer_bytes"`
					LayerChanged int   `json:"layer_changed"`
				} `json:"precopy"`
				Destination struct {
					LiveLayer string `json:"live_layer"`
				} `json:"destination"`
			}
			e.mustJSON(&res, "migrate", name, "--to", m.to, "--strategy", m.strategy, "--json")
			if !res.OK {
				t.Fatalf("migration %d of %s: %+v", i, name, res)
			}
			if m.strategy == "pre-copy" && (res.Precopy.LayerBytes <= 0 || res.Precopy.LayerChanged <= 0) {
				t.Errorf("migration %d of %s: layer sent live %d B, %d entries again: the live copy or the delta did not happen", i, name, res.Precopy.LayerBytes, res.Precopy.LayerChanged)
			}
			if m.strategy == "stop-and-copy" && res.ImagesEarly < 2 {
				t.Errorf("migration %d of %s: %d images sent while CRIU dumped, want each process's pages and pagemap (at least 2)", i, name, res.ImagesEarly)
			}
			t.Logf("migration %d of %s -> %s (%s): downtime %.1f ms, live layer %q, %d files patched (%d bytes), %d images early", i, name, m.to, m.strategy, res.DowntimeMs, res.Destination.LiveLayer, res.LayerPatched, res.LayerPatchBytes, res.ImagesEarly)
			if name == "p" && (res.LayerPatched != 1 || res.LayerPatchBytes <= 0 || res.LayerPatchBytes > 1<<20) {
				t.Errorf("migration %d of p: %d files patched with %d bytes, want its 4 MiB file as its changed blocks (under 1 MiB)", i, res.LayerPatched, res.LayerPatchBytes)
			}
			live[name] = append(live[name], res.Destination.LiveLayer)
			// The log restarts on the new node; the counter goes on.
			seen[name] = waitLog(name, fmt.Sprintf("after migration %d", i), seen[name])
		}
	}
	// Files come and go in w's layer; c's one file changes in place.
	if !slices.Contains(live["w"], "restarted") || !slices.Contains(live["c"], "rewritten") || slices.Contains(live["w"], "") || slices.Contains(live["c"], "") {
		t.Errorf("restores on the live layer: w %v (want each on one, one restarted), c %v (want each on one, one rewritten)", live["w"], live["c"])
	}
	if slices.Contains(live["p"], "") || slices.Contains(live["p"], "restarted") {
		t.Errorf("restores on the live layer: p %v (want each on one, patched in place or kept)", live["p"])
	}
}

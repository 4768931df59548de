package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
)

// PersistenceMethod names Redis's own persistence in persistence reports:
// the state saved as an RDB file, copied to the destination, a new
// redis-server started there and the file loaded.
const PersistenceMethod = "redis save/copy/restart/load"

// PersistenceConfig configures RunPersistence: H-Container (seed 003)
// Figs. 2 and 4, Redis persistence against CRIU, as the downtime a client
// of a Redis moved between two edge nodes sees.
type PersistenceConfig struct {
	Root, Binary, ImageRoot string
	Quick                   bool
	SizesMB                 []int    // dataset sizes (values stored)
	ValueBytes              int      // bytes per value: the dataset is SizesMB/ValueBytes keys
	Strategies              []string // edgehop's strategies measured at every size
	NodeLink, ClientLink    testbed.Link
	Log                     *slog.Logger
	Progress                func(PersistenceRow)
}

// DefaultPersistenceConfig: H-Container's Redis sizes (185, 350 and
// 638 MB in Fig. 26) on the continuity benchmark's 1 Gbit/s, 1 ms links;
// quick keeps two small sizes.
func DefaultPersistenceConfig() PersistenceConfig {
	def := DefaultConfig()
	return PersistenceConfig{ImageRoot: image.DefaultRoot, SizesMB: []int{64, 256, 640}, ValueBytes: 1000,
		Strategies: []string{string(migration.StopAndCopy), string(migration.PostCopy)},
		NodeLink:   def.NodeLink, ClientLink: def.ClientLink}
}

// sizes are the dataset sizes the run measures.
func (c PersistenceConfig) sizes() []int {
	if c.Quick {
		return []int{16, 128}
	}
	return c.SizesMB
}

// Validate checks the configuration.
func (c PersistenceConfig) Validate() error {
	var errs []error
	if len(c.sizes()) == 0 {
		errs = append(errs, errors.New("no dataset sizes"))
	}
	for _, s := range c.sizes() {
		if s < 1 || s > 16_000 {
			errs = append(errs, fmt.Errorf("dataset size %d MB outside 1..16000", s))
		}
	}
	if c.ValueBytes < 1 || c.ValueBytes > 64<<20 {
		errs = append(errs, fmt.Errorf("value size %d bytes outside 1..%d", c.ValueBytes, 64<<20))
	}
	for _, s := range c.Strategies {
		if _, err := migration.ParseStrategy(s); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range []testbed.Link{c.NodeLink, c.ClientLink} {
		if err := l.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PersistenceRow is one way of moving a Redis holding SizeMB of values
// from one node to the other.
type PersistenceRow struct {
	SizeMB         int    `json:"size_mb"`
	Method         string `json:"method"` // "edgehop <strategy>" or PersistenceMethod
	Keys           int    `json:"keys"`
	ValueBytes     int    `json:"value_bytes"`
	RedisUsedBytes int64  `json:"redis_used_bytes"`
	OK             bool   `json:"ok"`
	Error          string `json:"error,omitempty"`
	// DowntimeMs is what a client sees: the longest time between two
	// replies of a client sending requests back to back (live migration),
	// or from its last reply at the source to the first reply at the
	// destination with every key loaded (persistence).
	DowntimeMs float64 `json:"downtime_ms"`
	// EngineDowntimeMs is the migration's own frozen window (from freeze
	// to the restored service running); the client's DowntimeMs adds
	// the network's share and, after a post-copy restore, the time its
	// first replies wait for their pages.
	EngineDowntimeMs float64 `json:"engine_downtime_ms,omitempty"`
	// TotalMs: the migration request's duration; for persistence the
	// downtime (the service is down throughout).
	TotalMs float64 `json:"total_ms"`
	// PhasesMs: a migration's phases; persistence's save+copy (the RDB
	// streamed to the destination's disk) and restart+load.
	PhasesMs map[string]float64 `json:"phases_ms,omitempty"`
	// StateBytes is what the method writes: CRIU's images, or the RDB
	// file (H-Container Fig. 4); BytesOnWire what crossed the node link
	// (for persistence, the RDB stream).
	StateBytes  int64 `json:"state_bytes"`
	BytesOnWire int64 `json:"bytes_on_wire"`
	// DataVerified: the destination's DEBUG DIGEST equals the source's
	// before the move (every key and value).
	DataVerified bool `json:"data_verified"`
	// ConnectionKept: the client's connection survived (live migration
	// only; persistence always breaks it).
	ConnectionKept bool `json:"connection_kept"`
	// DowntimeVsPersistence is the persistence row's downtime over this
	// one's at the same size (above 1: this method is faster).
	DowntimeVsPersistence *float64 `json:"downtime_vs_persistence,omitempty"`
}

// PersistenceReport is what `edgehop bench persistence` prints.
type PersistenceReport struct {
	Testbed  TestbedInfo      `json:"testbed"`
	Quick    bool             `json:"quick"`
	Rows     []PersistenceRow `json:"rows"`
	Goals    []Goal           `json:"goals"`
	Notes    []string         `json:"notes"`
	ElapsedS float64          `json:"elapsed_s"`
}

// persistRedisArgs: redis without persistence of its own during the run
// (the baseline saves on demand), DEBUG DIGEST enabled to compare the data
// before and after, and the replication snapshot sent at once: with
// diskless sync redis otherwise waits 5 s for more replicas, which would
// count against the baseline.
func persistRedisArgs() []string {
	return append(redisArgs(), "--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0")
}

// Names of the benchmark's redis containers.
const (
	persistName    = "redis"
	persistRestore = "redis-restored"
	rdbPath        = "/tmp/dump.rdb"
)

// RunPersistence brings up a two-node testbed and, at every dataset size,
// fills a Redis on node0 from the client, moves it between the nodes with
// each edgehop strategy while a client sends requests back to back, then
// moves it with Redis's own persistence: the client stops (writes after
// the snapshot would be lost), the destination fetches an RDB snapshot
// over the node link (redis-cli --rdb: the source forks and streams its
// save), and a new redis-server started on it loads the file. Every
// destination's data is compared with the source's by DEBUG DIGEST.
func RunPersistence(ctx context.Context, cfg PersistenceConfig) (rep *PersistenceReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	log := orDiscard(cfg.Log)
	started := time.Now()
	e, down, err := warmTestbed(ctx, cfg.Root, cfg.Binary, cfg.ImageRoot, cfg.NodeLink, cfg.ClientLink, image.Services, log)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, down()) }()
	rep = &PersistenceReport{Quick: cfg.Quick, Testbed: e.testbedInfo()}
	for _, size := range cfg.sizes() {
		rows, err := e.persistenceSize(ctx, cfg, size)
		for _, r := range rows {
			if cfg.Progress != nil {
				cfg.Progress(r)
			}
		}
		rep.Rows = append(rep.Rows, rows...)
		if err != nil {
			return rep, fmt.Errorf("%d MB: %w", size, err)
		}
	}
	rep.Goals = persistenceGoals(rep.Rows)
	rep.Notes = []string{
		"downtime is the client's: the longest time without a reply to requests sent back to back (live), or from the last reply at the source to the first at the destination with every key loaded (persistence)",
		"persistence is given its fastest form: the snapshot streams straight to the destination (save and copy overlap) and redis answers as soon as the file is loaded",
		"H-Container Fig. 2 (local checkpoint/restore vs. Redis save/load, no network): CRIU up to 25x faster",
	}
	rep.ElapsedS = time.Since(started).Seconds()
	return rep, nil
}

// persistenceSize measures every method at one dataset size. The redis
// moves node0 → node1 → … with each strategy, then by persistence to the
// other node.
func (e *env) persistenceSize(ctx context.Context, cfg PersistenceConfig, size int) (rows []PersistenceRow, err error) {
	loc := e.node(nodeA).Name
	c, err := e.agents[loc].Run(ctx, api.RunRequest{Name: persistName, Image: image.Services, Args: persistRedisArgs(), Memory: bigServiceMemory})
	if err != nil {
		return nil, fmt.Errorf("run redis: %w", err)
	}
	cleanup := map[string]string{persistName: loc} // container → node, removed at the end
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for name, node := range cleanup {
			if rerr := e.agents[node].Remove(rctx, name); rerr != nil && !errors.Is(rerr, api.ErrNotFound) {
				err = errors.Join(err, fmt.Errorf("remove %s on %s: %w", name, node, rerr))
			}
		}
	}()
	addr := net.JoinHostPort(c.IP, redisPort)
	if err := waitListening(ctx, e.client, addr, 30*time.Second); err != nil {
		return nil, err
	}
	rc, err := dialRedis(ctx, e.client, addr)
	if err != nil {
		return nil, err
	}
	defer func() { rc.Close() }()
	keys, used, err := rc.fill(ctx, int64(size)*1e6, cfg.ValueBytes)
	if err != nil {
		return nil, err
	}
	digest, err := rc.digest()
	if err != nil {
		return nil, fmt.Errorf("DEBUG DIGEST at the source: %w", err)
	}
	for _, s := range cfg.Strategies {
		to := e.other(loc)
		row := PersistenceRow{SizeMB: size, Method: "edgehop " + s, Keys: keys, ValueBytes: cfg.ValueBytes, RedisUsedBytes: used}
		e.log.Info("persistence", "size_mb", size, "method", row.Method, "from", loc, "to", to)
		p, err := startPinger(ctx, e.client, addr)
		if err != nil {
			return rows, err
		}
		var res migration.Result
		merr := e.agents[loc].Migrate(ctx, persistName, api.MigrateRequest{To: to, Strategy: s, LinkBps: int64(e.st.PathRate(loc, to))}, &res)
		gap, perr := p.stopAfterReply(ctx, 30*time.Second)
		switch {
		case ctx.Err() != nil:
			return rows, ctx.Err()
		case merr != nil:
			return rows, fmt.Errorf("migrate redis (%s): %w", s, merr)
		}
		row.OK, row.Error = res.OK, res.Error
		row.DowntimeMs, row.EngineDowntimeMs, row.TotalMs, row.PhasesMs = ms(gap), res.DowntimeMs, res.TotalMs, res.PhasesMs
		row.StateBytes, row.BytesOnWire = res.StateBytes, res.BytesOnWire
		if res.OK {
			loc = to
			cleanup[persistName] = loc
		} else if !res.RolledBack {
			return append(rows, row), fmt.Errorf("redis lost in a failed %s migration: %s", s, res.Error)
		}
		row.ConnectionKept = perr == nil
		if perr != nil {
			row.OK = false
			row.Error = errors.Join(errorOrNil(row.Error), fmt.Errorf("client: %w", perr)).Error()
		}
		got, derr := rc.digest()
		row.DataVerified = derr == nil && got == digest
		if !row.DataVerified {
			row.OK = false
			row.Error = errors.Join(errorOrNil(row.Error), fmt.Errorf("data after the migration: digest %q (%v), want %q", got, derr, digest)).Error()
		}
		rows = append(rows, row)
		if derr != nil { // the next method needs a working client
			rc.Close()
			if rc, err = dialRedis(ctx, e.client, addr); err != nil {
				return rows, err
			}
		}
	}

	row, err := e.persistOnce(ctx, loc, e.other(loc), addr, keys, digest, cleanup)
	row.SizeMB, row.Keys, row.ValueBytes, row.RedisUsedBytes = size, keys, cfg.ValueBytes, used
	rows = append(rows, row)
	if err != nil {
		return rows, err
	}
	for i := range rows[:len(rows)-1] {
		if rows[i].OK && row.OK {
			rows[i].DowntimeVsPersistence = Ratio(row.DowntimeMs, rows[i].DowntimeMs)
		}
	}
	return rows, nil
}

// rdbBytes matches redis-cli --rdb's report of the snapshot it received.
var rdbBytes = regexp.MustCompile(`Transfer finished with success after (\d+) bytes`)

// persistOnce moves the redis at from (srcAddr) to node to with Redis's
// persistence and measures the client's downtime.
func (e *env) persistOnce(ctx context.Context, from, to, srcAddr string, keys int, digest string, cleanup map[string]string) (PersistenceRow, error) {
	row := PersistenceRow{Method: PersistenceMethod}
	srcIP, _, _ := net.SplitHostPort(srcAddr)
	e.log.Info("persistence", "method", row.Method, "from", from, "to", to)
	// The last reply the client gets from the source starts the downtime.
	rc, err := dialRedis(ctx, e.client, srcAddr)
	if err != nil {
		return row, err
	}
	_, err = rc.do(10*time.Second, "PING")
	rc.Close()
	if err != nil {
		return row, fmt.Errorf("source redis: %w", err)
	}
	t0 := time.Now()
	script := fmt.Sprintf("redis-cli -h %s -p %s --rdb %s && echo edgehop-rdb-done && exec %s",
		srcIP, redisPort, rdbPath, shellWords(append(persistRedisArgs(), "--dir", path.Dir(rdbPath), "--dbfilename", path.Base(rdbPath))))
	c, err := e.agents[to].Run(ctx, api.RunRequest{Name: persistRestore, Image: image.Services, Args: []string{"sh", "-c", script}, Memory: bigServiceMemory})
	if err != nil {
		return row, fmt.Errorf("run the restoring redis on %s: %w", to, err)
	}
	cleanup[persistRestore] = to
	addr := net.JoinHostPort(c.IP, redisPort)
	// Until the file is loaded the port is closed or redis answers
	// -LOADING; the downtime ends with the first full DBSIZE.
	deadline := time.Now().Add(10 * time.Minute)
	var dst *redisConn
	var copied, polled time.Time
	for {
		if ctx.Err() != nil {
			return row, ctx.Err()
		}
		if time.Now().After(deadline) {
			return row, fmt.Errorf("the restored redis on %s did not load %d keys in 10 minutes", to, keys)
		}
		if copied.IsZero() && time.Since(polled) > 20*time.Millisecond {
			polled = time.Now()
			if l := e.logs(ctx, to, persistRestore); strings.Contains(l, "edgehop-rdb-done") {
				copied = time.Now()
			} else if strings.Contains(l, "Error") || strings.Contains(l, "error") {
				return row, fmt.Errorf("redis-cli --rdb on %s: %s", to, strings.TrimSpace(l))
			}
		}
		if dst == nil {
			if dst, err = dialRedis(ctx, e.client, addr); err != nil {
				dst = nil
				time.Sleep(2 * time.Millisecond)
				continue
			}
		}
		n, err := dst.dbsize()
		if err == nil && n == keys {
			break
		}
		var re *redisError
		if err != nil && !errors.As(err, &re) { // not -LOADING: the connection broke
			dst.Close()
			dst = nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	t1 := time.Now()
	defer dst.Close()
	row.DowntimeMs, row.TotalMs = ms(t1.Sub(t0)), ms(t1.Sub(t0))
	if !copied.IsZero() && copied.Before(t1) {
		row.PhasesMs = map[string]float64{"save_copy": ms(copied.Sub(t0)), "restart_load": ms(t1.Sub(copied))}
	}
	if m := rdbBytes.FindStringSubmatch(e.logs(ctx, to, persistRestore)); m != nil {
		row.StateBytes, _ = strconv.ParseInt(m[1], 10, 64)
		row.BytesOnWire = row.StateBytes
	}
	got, derr := dst.digest()
	row.DataVerified = derr == nil && got == digest
	row.OK = row.DataVerified
	if !row.OK {
		row.Error = fmt.Sprintf("data after the restart: digest %q (%v), want %q", got, derr, digest)
	}
	return row, nil
}

// shellWords quotes each of args for sh (single quotes; an embedded one
// as '\”) and joins them with spaces.
func shellWords(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// logs returns a container's output so far ("" when it cannot be read).
func (e *env) logs(ctx context.Context, node, name string) string {
	var b bytes.Buffer
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = e.agents[node].Logs(lctx, name, &b)
	return b.String()
}

// pinger is a client sending PING back to back on its own connection,
// noting the longest time between two replies.
type pinger struct {
	rc      *redisConn
	mu      sync.Mutex
	last    time.Time
	maxGap  time.Duration
	replies int
	err     error
	stop    chan struct{}
	done    chan struct{}
}

func startPinger(ctx context.Context, d nsDialer, addr string) (*pinger, error) {
	rc, err := dialRedis(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	if _, err := rc.do(10*time.Second, "PING"); err != nil {
		rc.Close()
		return nil, fmt.Errorf("client PING: %w", err)
	}
	p := &pinger{rc: rc, last: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p, nil
}

func (p *pinger) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		s, err := p.rc.do(2*time.Minute, "PING")
		if err == nil && s != "PONG" {
			err = fmt.Errorf("PING answered %q", s)
		}
		now := time.Now()
		p.mu.Lock()
		select {
		case <-p.stop: // stopAfterReply closed the connection under it
			p.mu.Unlock()
			return
		default:
		}
		if err != nil {
			p.err = err
			p.mu.Unlock()
			return
		}
		p.maxGap = max(p.maxGap, now.Sub(p.last))
		p.last = now
		p.replies++
		p.mu.Unlock()
	}
}

// stopAfterReply waits for one more reply (the service answers again),
// stops the pinger (closing its connection, so a request in flight does
// not keep it) and returns the longest gap it saw.
func (p *pinger) stopAfterReply(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	p.mu.Lock()
	n := p.replies
	p.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		got, err := p.replies > n, p.err
		p.mu.Unlock()
		if got || err != nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	p.mu.Lock()
	close(p.stop)
	p.mu.Unlock()
	p.rc.Close()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.maxGap, p.err
	}
	if p.replies <= n {
		return p.maxGap, fmt.Errorf("no reply within %v after the migration", timeout)
	}
	return p.maxGap, nil
}

// writeGoals prints one line per goal.
func writeGoals(b *strings.Builder, goals []Goal) {
	for _, g := range goals {
		m := "not measured"
		if g.Measured != nil {
			m = fmt.Sprintf("%.2f", *g.Measured)
		}
		fmt.Fprintf(b, "goal %-60s %-10s measured %s met=%v\n", g.Name, g.Target, m, g.Met)
	}
}

// persistenceGoals: at every size, each live migration's downtime beats
// persistence's.
func persistenceGoals(rows []PersistenceRow) []Goal {
	var goals []Goal
	for _, r := range rows {
		if r.Method == PersistenceMethod {
			continue
		}
		g := Goal{Name: fmt.Sprintf("%s %d MB: downtime below Redis persistence's", r.Method, r.SizeMB), Target: "ratio > 1"}
		if r.DowntimeVsPersistence != nil {
			g.Measured = r.DowntimeVsPersistence
			g.Met = *r.DowntimeVsPersistence > 1
		}
		goals = append(goals, g)
	}
	return goals
}

// WriteText prints the report as a table.
func (r *PersistenceReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "H-Container Figs. 2/4 on %s: Redis moved between two nodes, live vs. its own persistence\n", r.Testbed.Name)
	fmt.Fprintf(&b, "%7s  %-30s %8s %12s %10s %10s %12s %9s  %s\n", "size MB", "method", "keys", "downtime ms", "engine ms", "total ms", "on wire", "vs pers.", "data / error")
	for _, row := range r.Rows {
		vs := "-"
		if row.DowntimeVsPersistence != nil {
			vs = fmt.Sprintf("%.1fx", *row.DowntimeVsPersistence)
		}
		what := "verified"
		switch {
		case !row.OK:
			what = "FAILED: " + row.Error
		case row.ConnectionKept:
			what += ", connection kept"
		}
		fmt.Fprintf(&b, "%7d  %-30s %8d %12.1f %10.1f %10.1f %12s %9s  %s\n", row.SizeMB, row.Method, row.Keys, row.DowntimeMs, row.EngineDowntimeMs, row.TotalMs,
			units.FormatSize(row.BytesOnWire), vs, what)
	}
	writeGoals(&b, r.Goals)
	fmt.Fprintf(&b, "elapsed %.0f s\n", r.ElapsedS)
	_, err := io.WriteString(w, b.String())
	return err
}

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
)

// CloudhopperConfig configures RunCloudhopper: CloudHopper's experiment
// (seed 004, Sec. V), WordPress and its MariaDB migrated as one group
// between two nodes across a WAN link while a load generator writes
// through WordPress's REST API.
type CloudhopperConfig struct {
	Root, Binary, ImageRoot string
	Quick                   bool
	// Clients are the concurrency levels, one migration each; 0 is the
	// idle run (only the availability probe).
	Clients  []int
	Strategy string
	// Pod runs the application as a pod (one network namespace and
	// address; WordPress reaches MariaDB at 127.0.0.1) instead of a group
	// of two addresses.
	Pod bool
	// NodeLink is each node's link to the core: a node-to-node path
	// crosses two, so its RTT is four times the delay.
	NodeLink, ClientLink testbed.Link
	// Warmup is how long the load runs before the migration, Tail how
	// long after it ends.
	Warmup, Tail time.Duration
	Log          *slog.Logger
	Progress     func(CloudhopperRun)
}

// DefaultCloudhopperConfig: CloudHopper's Table II concurrency levels on a
// 100 Mbit/s path with 30 ms RTT between the nodes (the WAN; the
// paper's clouds measured 735-793 Mbit/s transfer throughput, so this
// link is the harder one). Quick runs idle, 10 and 50 clients.
func DefaultCloudhopperConfig() CloudhopperConfig {
	return CloudhopperConfig{ImageRoot: image.DefaultRoot, Clients: []int{0, 1, 5, 10, 50, 100, 200, 400},
		Strategy: string(migration.PreCopy), NodeLink: nodeLinkFor(30, 100), ClientLink: DefaultConfig().ClientLink,
		Warmup: 10 * time.Second, Tail: 5 * time.Second}
}

// levels are the concurrency levels the run measures.
func (c CloudhopperConfig) levels() []int {
	if c.Quick {
		return []int{0, 10, 50}
	}
	return c.Clients
}

// Validate checks the configuration.
func (c CloudhopperConfig) Validate() error {
	var errs []error
	if len(c.levels()) == 0 {
		errs = append(errs, errors.New("no concurrency levels"))
	}
	for _, n := range c.levels() {
		if n < 0 || n > 10_000 {
			errs = append(errs, fmt.Errorf("%d clients outside 0..10000", n))
		}
	}
	if _, err := migration.ParseStrategy(c.Strategy); err != nil {
		errs = append(errs, err)
	}
	for _, l := range []testbed.Link{c.NodeLink, c.ClientLink} {
		if err := l.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Warmup < 0 || c.Tail < 0 {
		errs = append(errs, errors.New("negative warmup or tail"))
	}
	return errors.Join(errs...)
}

// CloudhopperRun is one group migration under one load.
type CloudhopperRun struct {
	Clients  int    `json:"clients"`
	Strategy string `json:"strategy"`
	From     string `json:"from"`
	To       string `json:"to"`
	OK       bool   `json:"ok"`
	Error    string `json:"error,omitempty"`
	// DowntimeMs is the group's frozen window as the engine measures it:
	// the longest member's, from its freeze to its restored process
	// running (CloudHopper's "total downtime", checkpoint to restore).
	DowntimeMs float64 `json:"downtime_ms"`
	// TotalMs is the group migration's duration (the longest member's
	// job), pre-copy included: CloudHopper's "total".
	TotalMs float64 `json:"total_ms"`
	// Members: each member's downtime, total and bytes on the wire.
	Members     []CloudhopperMember `json:"members"`
	BytesOnWire int64               `json:"bytes_on_wire"`
	// ForwardedConnections: connection requests held at the source
	// during the migration and handed to the destination.
	ForwardedConnections int `json:"forwarded_connections"`
	// The load generator's account (wrk, a new connection per request):
	// FailedRequests are connect, read, write errors and timeouts (60 s);
	// NonOK the replies that were not 2xx. wrk times a request from its
	// write to its reply, without the connection's setup (a request held
	// at the SYN waits there); WrkMaxLatencyMs and the percentiles are
	// its. MaxLatencyMs, the slowest request a client saw, is the larger
	// of wrk's slowest and the probe's, which counts from its connect.
	Requests       int64 `json:"requests"`
	FailedRequests int64 `json:"failed_requests"`
	// FailedBy splits FailedRequests by wrk's kind of error (connect,
	// read, write, timeout); empty when none failed.
	FailedBy        map[string]int64 `json:"failed_by,omitempty"`
	NonOK           int64            `json:"non_2xx"`
	NonOKSample     string           `json:"non_2xx_sample,omitempty"`
	ThroughputRPS   float64          `json:"throughput_rps"`
	MaxLatencyMs    float64          `json:"max_latency_ms"`
	WrkMaxLatencyMs float64          `json:"wrk_max_latency_ms"`
	P50LatencyMs    float64          `json:"p50_latency_ms"`
	P99LatencyMs    float64          `json:"p99_latency_ms"`
	// The availability probe: a REST read (PHP and the database) on a
	// new connection every 100 ms. At 0 clients its slowest request is
	// the downtime a client sees.
	ProbeRequests int     `json:"probe_requests"`
	ProbeErrors   int     `json:"probe_errors"`
	ProbeError    string  `json:"probe_error,omitempty"` // the first
	ProbeMaxMs    float64 `json:"probe_max_ms"`
	// WritesAcked: objects the load generator was told were created
	// (201); WritesStored: how many more posts, comments, categories,
	// tags and users WordPress lists after the run than before. DataOK:
	// no acknowledged write is missing, and no more are stored than
	// could have been in flight when wrk stopped (one per connection;
	// the load only reads for its last seconds, so normally none).
	WritesAcked  int64 `json:"writes_acked"`
	WritesStored int64 `json:"writes_stored"`
	DataOK       bool  `json:"data_ok"`
	// CloudHopper's Table III (AWS to GCP, average of ten runs) at the
	// same concurrency, and its downtime over ours.
	PaperDowntimeMs   float64  `json:"paper_downtime_ms,omitempty"`
	PaperTotalMs      float64  `json:"paper_total_ms,omitempty"`
	DowntimeVsPaper   *float64 `json:"downtime_vs_paper,omitempty"`
	ElapsedS          float64  `json:"elapsed_s"`
	LoadBeforeAndPast string   `json:"load_window"`
}

// CloudhopperMember is one member's share of a group migration.
type CloudhopperMember struct {
	Name        string  `json:"name"`
	DowntimeMs  float64 `json:"downtime_ms"`
	TotalMs     float64 `json:"total_ms"`
	BytesOnWire int64   `json:"bytes_on_wire"`
	StateBytes  int64   `json:"state_bytes"`
	// PhasesMs: the member's migration phases; Restore its
	// destination's own account of the frozen window.
	PhasesMs map[string]float64       `json:"phases_ms,omitempty"`
	Restore  *migration.RestoreReport `json:"restore,omitempty"`
	// Precopy: pre-copy's and hybrid's live rounds and final delta.
	Precopy *migration.Precopy `json:"precopy,omitempty"`
	// CRIU: the dump's own statistics (its freeze, memory dump and
	// write times).
	CRIU map[string]float64 `json:"criu,omitempty"`
}

// CloudhopperReport is what `edgehop bench cloudhopper` prints.
type CloudhopperReport struct {
	Testbed  TestbedInfo      `json:"testbed"`
	NodeRTT  float64          `json:"node_rtt_ms"`
	Quick    bool             `json:"quick"`
	Pod      bool             `json:"pod,omitempty"`
	Runs     []CloudhopperRun `json:"runs"`
	Goals    []Goal           `json:"goals"`
	Notes    []string         `json:"notes"`
	ElapsedS float64          `json:"elapsed_s"`
}

// cloudhopperTable3 is CloudHopper's Table III, AWS to GCP: clients →
// {total downtime, total} in seconds.
var cloudhopperTable3 = map[int][2]float64{
	0: {7.547, 12.361}, 1: {9.903, 14.543}, 5: {10.643, 16.030}, 10: {11.317, 18.040},
	50: {20.633, 28.836}, 100: {21.017, 29.254}, 200: {24.106, 32.095}, 400: {24.456, 34.776},
}

// The application's names, and WordPress's administrator (the load
// generator writes as it).
const (
	chGroup    = "wp"
	chDB       = "db"
	chWeb      = "web"
	chWebPort  = "8080"
	chDBPort   = "3306"
	chAdmin    = "admin"
	chPassword = "edgehop-bench"
)

// chKinds are the REST collections the workload writes to.
var chKinds = []string{"posts", "comments", "categories", "tags", "users"}

// RunCloudhopper brings up a two-node testbed, deploys WordPress and
// MariaDB on node0 as one group (the web tier after the database),
// installs WordPress, and at every concurrency level migrates the group
// to the other node while wrk writes and reads through the REST API and a
// probe reads every 100 ms. It reports the engine's downtime and total
// time, the requests that failed or were not 2xx, the slowest request,
// and checks that every acknowledged write is stored.
func RunCloudhopper(ctx context.Context, cfg CloudhopperConfig) (rep *CloudhopperReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	if _, err := exec.LookPath("wrk"); err != nil {
		return nil, errors.New("wrk, the load generator, is not installed: run 'make setup' (or apt-get install wrk)")
	}
	log := orDiscard(cfg.Log)
	started := time.Now()
	e, down, err := warmTestbed(ctx, cfg.Root, cfg.Binary, cfg.ImageRoot, cfg.NodeLink, cfg.ClientLink, image.WordPress, log)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, down()) }()
	rep = &CloudhopperReport{Quick: cfg.Quick, Pod: cfg.Pod, NodeRTT: 4 * ms(cfg.NodeLink.Delay), Testbed: e.testbedInfo()}
	app, err := e.deployWordPress(ctx, cfg.Pod)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "edgehop-cloudhopper-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	script := filepath.Join(work, "workload.lua")
	if err := os.WriteFile(script, []byte(wrkScript(chAdmin, chPassword, filepath.Join(work, "stop"))), 0o644); err != nil {
		return nil, err
	}
	for _, n := range cfg.levels() {
		run, err := e.cloudhopperRun(ctx, cfg, app, script, n)
		if cfg.Progress != nil {
			cfg.Progress(run)
		}
		rep.Runs = append(rep.Runs, run)
		if err != nil {
			return rep, fmt.Errorf("%d clients: %w", n, err)
		}
	}
	rep.Goals = cloudhopperGoals(rep.Runs)
	rep.Notes = []string{
		fmt.Sprintf("node-to-node path: %.0f Mbit/s, %.0f ms RTT; CloudHopper crossed AWS to GCP (about 790 Mbit/s transfer throughput)", float64(cfg.NodeLink.RateBps)/1e6, rep.NodeRTT),
		"downtime: the engine's frozen window of the group's slowest member; probe_max_ms is the slowest REST read the probe made, connection setup included (wrk's latencies leave it out); max_latency_ms is the larger of the two",
		"the load: wrk, a new connection per request (as siege's default), posting unique content at random to posts, comments, categories, tags and users, or reading the latest posts",
		"paper: CloudHopper Table III, AWS to GCP, averages of ten runs",
	}
	rep.ElapsedS = time.Since(started).Seconds()
	return rep, nil
}

// wpApp is the deployed application.
type wpApp struct {
	node    string // where the group runs now
	webAddr string // host:port of WordPress
	http    *http.Client
}

// deployWordPress runs the database and the web tier on node0 as group
// chGroup (with pod: as pod chGroup, the database first) and installs
// WordPress through its installer.
func (e *env) deployWordPress(ctx context.Context, pod bool) (*wpApp, error) {
	loc := e.node(nodeA).Name
	dbReq := api.RunRequest{Name: chDB, Image: image.WordPress, Group: chGroup, Args: []string{"edgehop-mariadb"}}
	if pod {
		dbReq.Group, dbReq.Pod = "", chGroup
	}
	db, err := e.agents[loc].Run(ctx, dbReq)
	if err != nil {
		return nil, fmt.Errorf("run the database: %w", err)
	}
	if err := waitListening(ctx, e.client, net.JoinHostPort(db.IP, chDBPort), time.Minute); err != nil {
		return nil, fmt.Errorf("the database: %w (its log: %s)", err, tail(e.logs(ctx, loc, chDB), 400))
	}
	webReq := api.RunRequest{Name: chWeb, Image: image.WordPress, Group: chGroup, After: []string{chDB},
		Env: []string{"WORDPRESS_DB_HOST=" + db.IP}, Args: []string{"edgehop-wordpress"}}
	if pod {
		webReq.Group, webReq.Pod, webReq.Env = "", chGroup, []string{"WORDPRESS_DB_HOST=127.0.0.1"}
	}
	web, err := e.agents[loc].Run(ctx, webReq)
	if err != nil {
		return nil, fmt.Errorf("run WordPress: %w", err)
	}
	// A client waits for its connection as long as for its reply (wrk's
	// 60 s): a request held at the SYN during a migration is not a failure.
	dialer := nsDialer{ns: e.client.ns, timeout: time.Minute}
	app := &wpApp{node: loc, webAddr: net.JoinHostPort(web.IP, chWebPort),
		http: &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}}
	if err := waitListening(ctx, e.client, app.webAddr, time.Minute); err != nil {
		return nil, fmt.Errorf("WordPress: %w (its log: %s)", err, tail(e.logs(ctx, loc, chWeb), 400))
	}
	form := url.Values{"weblog_title": {"edgehop"}, "user_name": {chAdmin}, "admin_password": {chPassword},
		"admin_password2": {chPassword}, "pw_weak": {"on"}, "admin_email": {"admin@example.com"}, "blog_public": {"0"}}
	resp, err := app.http.PostForm("http://"+app.webAddr+"/wp-admin/install.php?step=2", form)
	if err != nil {
		return nil, fmt.Errorf("install WordPress: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("wp-login.php")) {
		return nil, fmt.Errorf("install WordPress: HTTP %d: %s", resp.StatusCode, tail(string(body), 300))
	}
	// The workload's writes must work before anything is measured.
	if _, err := app.totals(ctx); err != nil {
		return nil, err
	}
	return app, nil
}

// restGet reads one REST route as the administrator and returns the
// response's X-WP-Total.
func (a *wpApp) restTotal(ctx context.Context, route string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.webAddr+"/?rest_route="+route, nil)
	if err != nil {
		return 0, err
	}
	req.SetBasicAuth(chAdmin, chPassword)
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: HTTP %d: %s", route, resp.StatusCode, tail(string(body), 200))
	}
	n, err := strconv.ParseInt(resp.Header.Get("X-WP-Total"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("GET %s: X-WP-Total %q", route, resp.Header.Get("X-WP-Total"))
	}
	return n, nil
}

// totals is how many objects of every kind the workload writes WordPress
// lists (users with context=edit: all of them, not only authors).
func (a *wpApp) totals(ctx context.Context) (int64, error) {
	var sum int64
	for _, k := range chKinds {
		route := "/wp/v2/" + k + "&per_page=1"
		if k == "users" {
			route += "&context=edit"
		}
		n, err := a.restTotal(ctx, route)
		if err != nil {
			return 0, fmt.Errorf("count %s: %w", k, err)
		}
		sum += n
	}
	return sum, nil
}

// cloudhopperRun migrates the group once under clients concurrent
// clients.
func (e *env) cloudhopperRun(ctx context.Context, cfg CloudhopperConfig, app *wpApp, script string, clients int) (CloudhopperRun, error) {
	t0 := time.Now()
	from, to := app.node, e.other(app.node)
	run := CloudhopperRun{Clients: clients, Strategy: cfg.Strategy, From: from, To: to,
		LoadBeforeAndPast: fmt.Sprintf("%s before, %s after", cfg.Warmup, cfg.Tail)}
	if p, ok := cloudhopperTable3[clients]; ok {
		run.PaperDowntimeMs, run.PaperTotalMs = p[0]*1000, p[1]*1000
	}
	before, err := app.totals(ctx)
	if err != nil {
		return run, err
	}
	e.log.Info("cloudhopper run", "clients", clients, "from", from, "to", to)
	pctx, stopProbe := context.WithCancel(ctx)
	probeDone := make(chan probeStats, 1)
	go func() { probeDone <- app.probe(pctx, 100*time.Millisecond) }()
	var load *wrkRun
	if clients > 0 {
		if load, err = startWrk(ctx, e.client.ns, script, "http://"+app.webAddr+"/", clients); err != nil {
			stopProbe()
			<-probeDone
			return run, err
		}
	}
	sleepCtx(ctx, cfg.Warmup)
	jobs, merr := e.agents[from].MigrateGroup(ctx, chGroup, api.MigrateRequest{To: to, Strategy: cfg.Strategy, LinkBps: int64(e.st.PathRate(from, to))})
	sleepCtx(ctx, cfg.Tail)
	var ws wrkStats
	var werr error
	if load != nil {
		ws, werr = load.stop()
	}
	stopProbe()
	ps := <-probeDone
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	if merr != nil {
		return run, fmt.Errorf("migrate the group: %w", merr)
	}
	members := make([]migration.Result, len(jobs))
	for i, j := range jobs {
		r, err := j.MigrationResult()
		if err != nil {
			return run, err
		}
		members[i] = r
		run.Members = append(run.Members, CloudhopperMember{Name: r.Container, DowntimeMs: r.DowntimeMs, TotalMs: r.TotalMs,
			BytesOnWire: r.BytesOnWire, StateBytes: r.StateBytes, PhasesMs: r.PhasesMs, Restore: r.Destination, Precopy: r.Precopy, CRIU: r.CRIU})
	}
	unit := migration.UnitResult(members)
	run.OK, run.DowntimeMs, run.TotalMs = unit.OK, unit.DowntimeMs, unit.TotalMs
	run.BytesOnWire, run.ForwardedConnections = unit.BytesOnWire, unit.ForwardedConnections
	if !unit.OK {
		run.Error = errors.Join(errorOrNil(run.Error), errors.New(unit.Error)).Error()
	}
	if run.OK {
		app.node = to
	}
	if werr != nil {
		return run, werr
	}
	run.Requests, run.NonOK, run.NonOKSample, run.WritesAcked = ws.Requests, ws.NonOK, ws.Bad, ws.Created
	run.FailedRequests = ws.ConnectErrors + ws.ReadErrors + ws.WriteErrors + ws.TimeoutErrors
	for k, n := range map[string]int64{"connect": ws.ConnectErrors, "read": ws.ReadErrors, "write": ws.WriteErrors, "timeout": ws.TimeoutErrors} {
		if n > 0 {
			if run.FailedBy == nil {
				run.FailedBy = map[string]int64{}
			}
			run.FailedBy[k] = n
		}
	}
	if ws.DurationUs > 0 {
		run.ThroughputRPS = float64(ws.Requests) / (float64(ws.DurationUs) / 1e6)
	}
	run.WrkMaxLatencyMs, run.P50LatencyMs, run.P99LatencyMs = float64(ws.MaxUs)/1000, float64(ws.P50Us)/1000, float64(ws.P99Us)/1000
	run.ProbeRequests, run.ProbeErrors, run.ProbeMaxMs = ps.requests, ps.errors, ms(ps.max)
	run.MaxLatencyMs = max(run.WrkMaxLatencyMs, run.ProbeMaxMs)
	if ps.first != nil {
		run.ProbeError = ps.first.Error()
	}
	after, err := app.totals(ctx)
	if err != nil {
		return run, fmt.Errorf("after the migration: %w", err)
	}
	run.WritesStored = after - before
	// A write whose reply had not arrived when wrk stopped (at most one
	// per connection; the workload reads only for wrkDrain before) is
	// stored but not acknowledged; an acknowledged write missing is lost.
	run.DataOK = run.WritesStored >= run.WritesAcked && run.WritesStored-run.WritesAcked <= int64(clients)
	if !run.DataOK {
		run.OK = false
		run.Error = errors.Join(errorOrNil(run.Error), fmt.Errorf("%d writes acknowledged, %d stored", run.WritesAcked, run.WritesStored)).Error()
	}
	if run.FailedRequests > 0 || run.NonOK > 0 || run.ProbeErrors > 0 {
		run.OK = false
		run.Error = errors.Join(errorOrNil(run.Error), fmt.Errorf("%d failed requests %v, %d not 2xx, %d probe errors", run.FailedRequests, run.FailedBy, run.NonOK, run.ProbeErrors)).Error()
	}
	if run.PaperDowntimeMs > 0 && run.OK {
		run.DowntimeVsPaper = Ratio(run.PaperDowntimeMs, run.DowntimeMs)
	}
	run.ElapsedS = time.Since(t0).Seconds()
	return run, nil
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// probeStats is what the availability probe saw.
type probeStats struct {
	requests, errors int
	first            error
	max              time.Duration
}

// probe reads the latest post on a new connection every period until ctx
// ends, waiting for each reply (up to a minute).
func (a *wpApp) probe(ctx context.Context, period time.Duration) probeStats {
	var st probeStats
	for ctx.Err() == nil {
		t := time.Now()
		req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, "http://"+a.webAddr+"/?rest_route=/wp/v2/posts&per_page=1", nil)
		resp, err := a.http.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("HTTP %d", resp.StatusCode)
			}
		}
		st.requests++
		if err != nil {
			st.errors++
			if st.first == nil {
				st.first = fmt.Errorf("at %s: %w", t.Format("15:04:05.000"), err)
			}
		}
		st.max = max(st.max, time.Since(t))
		sleepCtx(ctx, period-time.Since(t))
	}
	return st
}

// wrkRun is a running wrk.
type wrkRun struct {
	stopFile string
	clients  int
	cmd      *exec.Cmd
	out      bytes.Buffer
	done     chan error
}

// wrkStats is the line the workload script prints when wrk stops.
type wrkStats struct {
	Requests      int64  `json:"requests"`
	DurationUs    int64  `json:"duration_us"`
	ConnectErrors int64  `json:"connect_errors"`
	ReadErrors    int64  `json:"read_errors"`
	WriteErrors   int64  `json:"write_errors"`
	TimeoutErrors int64  `json:"timeout_errors"`
	OK            int64  `json:"ok_2xx"`
	NonOK         int64  `json:"non_2xx"`
	Created       int64  `json:"created"`
	MaxUs         int64  `json:"max_latency_us"`
	P50Us         int64  `json:"p50_latency_us"`
	P99Us         int64  `json:"p99_latency_us"`
	Bad           string `json:"bad"`
}

// startWrk runs wrk in the client's network namespace with clients
// connections until stop.
func startWrk(ctx context.Context, netns, script, target string, clients int) (*wrkRun, error) {
	threads := min(2, clients)
	w := &wrkRun{stopFile: filepath.Join(filepath.Dir(script), "stop"), clients: clients, done: make(chan error, 1)}
	if err := os.Remove(w.stopFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	w.cmd = exec.CommandContext(ctx, "nsenter", "--net="+netns, "wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(clients),
		"-d", "3600s", "--timeout", "60s", "-s", script, target)
	w.cmd.Stdout, w.cmd.Stderr = &w.out, &w.out
	w.cmd.WaitDelay = 5 * time.Second
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start wrk: %w", err)
	}
	go func() { w.done <- w.cmd.Wait() }()
	return w, nil
}

// wrkDrain is how long the workload only reads before wrk stops, for the
// replies to its last writes to arrive: 5 s, and 40 ms more per client
// (two cores answer about 40 requests a second).
func wrkDrain(clients int) time.Duration {
	return 5*time.Second + time.Duration(clients)*40*time.Millisecond
}

// stop turns the workload to reads, waits wrkDrain, interrupts wrk (it
// then prints its summary) and parses the script's line.
func (w *wrkRun) stop() (wrkStats, error) {
	var st wrkStats
	if err := os.WriteFile(w.stopFile, nil, 0o644); err != nil {
		return st, err
	}
	time.Sleep(wrkDrain(w.clients))
	_ = w.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-w.done:
		if err != nil {
			return st, fmt.Errorf("wrk: %w: %s", err, tail(w.out.String(), 400))
		}
	case <-time.After(90 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
		return st, fmt.Errorf("wrk did not stop within 90 s of its interrupt: %s", tail(w.out.String(), 400))
	}
	sc := bufio.NewScanner(&w.out)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "EDGEHOP "); ok {
			if err := json.Unmarshal([]byte(line), &st); err != nil {
				return st, fmt.Errorf("wrk's summary %q: %w", line, err)
			}
			return st, nil
		}
	}
	return st, fmt.Errorf("wrk printed no summary: %s", tail(w.out.String(), 400))
}

// tail is the end of s, at most n bytes.
func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// wrkScript is the workload (CloudHopper Sec. V-A): a new connection per
// request; at random, new content posted to one of posts, comments,
// categories, tags and users, every body unique (the paper's siege
// "--random-strings"), or the latest posts read; only reads once stopFile
// exists, so that every write has its reply when wrk stops. Each thread
// counts its
// 2xx, other and 201 replies; done prints them with wrk's own counts as
// one JSON line.
func wrkScript(user, password, stopFile string) string {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	return `-- edgehop bench cloudhopper: CloudHopper's workload through WordPress's REST API.
local auth = "Basic ` + auth + `"
local stopfile = "` + stopFile + `"
local draining = false
local kinds = {"posts", "comments", "categories", "tags", "users"}
local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() * 1000 + id)
  ok2xx, non2xx, created, bad = 0, 0, 0, ""
end

local function rnd(n)
  local t = {}
  for i = 1, n do t[i] = string.char(math.random(97, 122)) end
  return table.concat(t)
end

function request()
  if not draining then
    local f = io.open(stopfile, "r")
    if f then f:close() draining = true end
  end
  local k = math.random(#kinds + 1)
  local h = {["Connection"] = "close", ["Authorization"] = auth}
  if draining or k > #kinds then
    return wrk.format("GET", "/?rest_route=/wp/v2/posts&per_page=5", h)
  end
  local s = rnd(16)
  local body
  if kinds[k] == "posts" then
    body = '{"title":"' .. s .. '","content":"' .. s .. '","status":"publish"}'
  elseif kinds[k] == "comments" then
    body = '{"post":1,"content":"' .. s .. '"}'
  elseif kinds[k] == "users" then
    body = '{"username":"' .. s .. '","email":"' .. s .. '@example.com","password":"' .. s .. '"}'
  else
    body = '{"name":"' .. s .. '"}'
  end
  h["Content-Type"] = "application/json"
  return wrk.format("POST", "/?rest_route=/wp/v2/" .. kinds[k], h, body)
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    ok2xx = ok2xx + 1
  else
    non2xx = non2xx + 1
    if #bad < 300 then bad = bad .. status .. " " .. string.sub(body or "", 1, 100) .. "; " end
  end
  if status == 201 then created = created + 1 end
end

function done(summary, latency, requests)
  local ok, non, cr, b = 0, 0, 0, ""
  for _, t in ipairs(threads) do
    ok = ok + t:get("ok2xx")
    non = non + t:get("non2xx")
    cr = cr + t:get("created")
    b = b .. t:get("bad")
  end
  local e = summary.errors
  local f = math.floor
  io.write(string.format('EDGEHOP {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeout_errors":%d,"ok_2xx":%d,"non_2xx":%d,"created":%d,"max_latency_us":%d,"p50_latency_us":%d,"p99_latency_us":%d,"bad":"%s"}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout, ok, non, cr,
    f(latency.max), f(latency:percentile(50)), f(latency:percentile(99)), (string.gsub(b, '[%c"\\]', ' '))))
end
`
}

// cloudhopperGoals: the targets, no failed request at any load
// and a downtime ten times below CloudHopper's (idle ≤ 0.75 s, loaded
// ≤ 2.4 s).
func cloudhopperGoals(runs []CloudhopperRun) []Goal {
	var goals []Goal
	for _, r := range runs {
		failed := float64(r.FailedRequests + r.NonOK + int64(r.ProbeErrors))
		goals = append(goals, Goal{Name: fmt.Sprintf("%d clients: no failed or non-2xx request", r.Clients), Target: "0",
			Measured: &failed, Met: failed == 0 && r.Members != nil})
		limit := 2400.0
		if r.Clients == 0 {
			limit = 750
		}
		g := Goal{Name: fmt.Sprintf("%d clients: downtime", r.Clients), Target: fmt.Sprintf("<= %.0f ms", limit)}
		if r.Members != nil {
			d := r.DowntimeMs
			g.Measured, g.Met = &d, r.OK && d <= limit
		}
		goals = append(goals, g)
	}
	return goals
}

// WriteText prints the report as a table.
func (r *CloudhopperReport) WriteText(w io.Writer) error {
	var b strings.Builder
	unit := "group"
	if r.Pod {
		unit = "pod"
	}
	fmt.Fprintf(&b, "CloudHopper (Table III) on %s: WordPress + MariaDB migrated as a %s, %.0f Mbit/s, %.0f ms RTT\n",
		r.Testbed.Name, unit, float64(r.Testbed.NodeRateBps)/1e6, r.NodeRTT)
	fmt.Fprintf(&b, "%7s %11s %9s %10s %9s %7s %7s %8s %9s %9s %11s %11s  %s\n", "clients", "downtime ms", "total ms", "on wire", "requests",
		"failed", "non-2xx", "max ms", "wrk max", "writes", "paper down", "vs paper", "error")
	for _, x := range r.Runs {
		vs := "-"
		if x.DowntimeVsPaper != nil {
			vs = fmt.Sprintf("%.1fx", *x.DowntimeVsPaper)
		}
		fmt.Fprintf(&b, "%7d %11.1f %9.1f %10s %9d %7d %7d %8.1f %9.1f %4d/%-4d %11.0f %11s  %s\n", x.Clients, x.DowntimeMs, x.TotalMs,
			units.FormatSize(x.BytesOnWire), x.Requests, x.FailedRequests, x.NonOK, x.MaxLatencyMs, x.WrkMaxLatencyMs, x.WritesStored, x.WritesAcked,
			x.PaperDowntimeMs, vs, x.Error)
	}
	writeGoals(&b, r.Goals)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

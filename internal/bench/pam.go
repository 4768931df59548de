package bench

// The PAM benchmark: DPRGen migrations over a grid of state size M, dirty
// rate R and link rate L; the performance models are fitted on half of the
// runs and their prediction error is measured on the other half.
//
// Identifiers here carry a pam/PAM prefix: the package is shared with the
// continuity benchmark.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/model"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
	"github.com/edgehop/edgehop/internal/workload"
)

// PAMConfig describes one PAM benchmark.
type PAMConfig struct {
	Root         string // testbed state root
	Binary       string // edgehop binary the testbed's agents run
	ImageRoot    string // OCI image cache ("" = image.DefaultRoot)
	DPRGenBinary string // static dprgen for the image; "" = "dprgen" next to Binary
	Name         string // testbed name; "" picks a fresh one

	StatesMB   []float64 // M, in MB (10^6 bytes)
	Rates      []string  // R: "min" (1 page/ΔT) and/or "max" (⌊M/σ⌋/ΔT), ΔT = 1 s
	LinksBps   []uint64  // L of both node links
	LinkDelay  time.Duration
	Strategies []string // strategies to try; one the agents refuse is reported unavailable
	// Reps is the number of migrations of each DPRGen container,
	// alternating node0 → node1 → node0 …; even reps go to the fit half,
	// odd reps to the test half.
	Reps int
	Seed uint64

	Log      *slog.Logger
	Progress func(PAMRun) // called after every migration; nil: not called
}

// PAMGoalPct is the goal: median relative error of the extended
// model at most 10% for downtime and total time.
const PAMGoalPct = 10

// DefaultPAMConfig returns the grid: M ∈ {10, 50, 100, 200, 500}
// MB, R ∈ {R_min, R_max}, L ∈ {100 Mbit/s, 1 Gbit/s}, stop-and-copy and
// post-copy (when available), two migrations per container. quick reduces
// it to M ∈ {10, 50, 100} on 1 Gbit/s with four migrations per container,
// so each half still has a dozen migrations per strategy (about three
// minutes).
func DefaultPAMConfig(quick bool) PAMConfig {
	c := PAMConfig{
		ImageRoot:  image.DefaultRoot,
		StatesMB:   []float64{10, 50, 100, 200, 500},
		Rates:      []string{"min", "max"},
		LinksBps:   []uint64{100_000_000, 1_000_000_000},
		LinkDelay:  time.Millisecond,
		Strategies: []string{string(migration.StopAndCopy), string(migration.PostCopy)},
		Reps:       2,
		Seed:       1,
	}
	if quick {
		c.StatesMB = []float64{10, 50, 100}
		c.LinksBps = []uint64{1_000_000_000}
		c.Reps = 4
	}
	return c
}

// Validate checks the configuration.
func (c PAMConfig) Validate() error {
	var errs []error
	if c.Root == "" || c.Binary == "" {
		errs = append(errs, errors.New("testbed root and edgehop binary are required"))
	}
	if len(c.StatesMB) == 0 || len(c.Rates) == 0 || len(c.LinksBps) == 0 || len(c.Strategies) == 0 {
		errs = append(errs, errors.New("the grid needs at least one state size, rate, link rate and strategy"))
	}
	for _, m := range c.StatesMB {
		if !(m >= 0.01) || m > 16_000 {
			errs = append(errs, fmt.Errorf("state %v MB outside 0.01..16000", m))
		}
	}
	for _, r := range c.Rates {
		if r != "min" && r != "max" {
			errs = append(errs, fmt.Errorf("rate %q: want min or max", r))
		}
	}
	for _, l := range c.LinksBps {
		if err := (testbed.Link{RateBps: l, Delay: c.LinkDelay}).Validate(); err != nil || l == 0 {
			errs = append(errs, fmt.Errorf("link %d bit/s: must be shaped (non-zero): %v", l, err))
		}
	}
	for _, s := range c.Strategies {
		if st, err := migration.ParseStrategy(s); err != nil || st == migration.Auto {
			errs = append(errs, fmt.Errorf("strategy %q: want stop-and-copy or post-copy", s))
		}
	}
	if c.Reps < 1 || c.Reps > 100 {
		errs = append(errs, fmt.Errorf("reps %d outside 1..100", c.Reps))
	}
	return errors.Join(errs...)
}

// PAMRun is one migration of the benchmark.
type PAMRun struct {
	Index     int     `json:"index"`
	StateMB   float64 `json:"state_mb"`
	Rate      string  `json:"rate"`       // min | max
	DirtyRate float64 `json:"dirty_rate"` // pages/s, as DPRGen reports it
	LinkBps   uint64  `json:"link_bps"`
	Strategy  string  `json:"strategy"`
	Rep       int     `json:"rep"`
	Half      string  `json:"half"` // fit | test
	From      string  `json:"from"`
	To        string  `json:"to"`

	OK         bool    `json:"ok"` // the migration succeeded
	Error      string  `json:"error,omitempty"`
	DowntimeMs float64 `json:"downtime_ms"`
	TotalMs    float64 `json:"total_ms"`

	// DPRGen's verification of its whole memory after the migration.
	Check    string `json:"check"`
	MemoryOK bool   `json:"memory_ok"`
	// ConnectionKept: the check went over the TCP connection the client
	// opened before the migration.
	ConnectionKept bool `json:"connection_kept"`
	// Load1 is the machine's 1-minute load average after the migration:
	// other work on the machine slows migrations down unpredictably.
	Load1 float64 `json:"load1"`
	// FreezesSeen is how many freezes DPRGen's pacer has noticed so far.
	FreezesSeen int `json:"freezes_seen"`

	Sample int `json:"sample"` // index in PAMReport.Samples; -1 without one
}

// PAMStrategy says whether a strategy could run.
type PAMStrategy struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

// PAMErrStats summarises relative prediction errors in percent.
type PAMErrStats struct {
	MedianPct float64 `json:"median_pct"`
	P90Pct    float64 `json:"p90_pct"`
	MaxPct    float64 `json:"max_pct"`
}

// PAMModelError is one model's prediction error on the test half, for the
// samples of one strategy.
type PAMModelError struct {
	Model       string      `json:"model"`
	Strategy    string      `json:"strategy"`
	Description string      `json:"description"`
	N           int         `json:"n"`
	Downtime    PAMErrStats `json:"downtime"`
	Total       PAMErrStats `json:"total"`
}

// PAMPrediction is one model's prediction of one test sample.
type PAMPrediction struct {
	Sample         int     `json:"sample"`
	Model          string  `json:"model"`
	DowntimeMs     float64 `json:"downtime_ms"`
	TotalMs        float64 `json:"total_ms"`
	DowntimeErrPct float64 `json:"downtime_err_pct"`
	TotalErrPct    float64 `json:"total_err_pct"`
}

// PAMGoal is the goal for the extended model on one strategy.
type PAMGoal struct {
	Model       string  `json:"model"`
	Strategy    string  `json:"strategy"`
	MaxMedian   float64 `json:"max_median_pct"`
	DowntimeMet bool    `json:"downtime_met"`
	TotalMet    bool    `json:"total_met"`
}

// PAMReport is the outcome of RunPAM.
type PAMReport struct {
	Testbed     string           `json:"testbed"`
	Grid        PAMGridInfo      `json:"grid"`
	Strategies  []PAMStrategy    `json:"strategies"`
	Warmup      *PAMRun          `json:"warmup,omitempty"`
	Runs        []PAMRun         `json:"runs"`
	FitRuns     int              `json:"fit_runs"`
	TestRuns    int              `json:"test_runs"`
	MemoryBad   int              `json:"memory_bad"` // runs whose DPRGen check failed
	Models      []PAMModelError  `json:"models"`
	Goals       []PAMGoal        `json:"goals"`
	Fit         *model.FitResult `json:"fit,omitempty"`
	Predictions []PAMPrediction  `json:"predictions"`
	Samples     []model.Sample   `json:"samples"`
	Notes       []string         `json:"notes,omitempty"`
	DurationS   float64          `json:"duration_s"`
}

// PAMGridInfo records the grid that ran.
type PAMGridInfo struct {
	StatesMB    []float64 `json:"states_mb"`
	Rates       []string  `json:"rates"`
	LinksBps    []uint64  `json:"links_bps"`
	LinkDelayMs float64   `json:"link_delay_ms"`
	RTTMs       float64   `json:"rtt_ms"`
	Reps        int       `json:"reps"`
	IntervalMs  float64   `json:"interval_ms"` // DPRGen's ΔT
}

// pamPair labels every sample in the fit: both directions run over
// identical links, so they form one pair.
const pamPair = "node0<->node1"

// pamInterval is DPRGen's ΔT, PAM's 1 s (Fig. 7), which the model's
// DirtyIntervalMs assumes.
const pamInterval = time.Second

// RunPAM brings up a two-node testbed, runs the grid, tears the testbed
// down whatever happens, and returns the report with the fitted models'
// errors. Runs that fail are reported, not returned as errors; the error
// is for a benchmark that could not run at all.
func RunPAM(ctx context.Context, cfg PAMConfig) (rep *PAMReport, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	started := time.Now()
	bed, err := pamUp(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, bed.down(ctx)) }()

	rep = &PAMReport{Testbed: bed.st.Name, Grid: PAMGridInfo{StatesMB: cfg.StatesMB, Rates: cfg.Rates, LinksBps: cfg.LinksBps,
		LinkDelayMs: ms(cfg.LinkDelay), RTTMs: bed.rttMs, Reps: cfg.Reps, IntervalMs: ms(pamInterval)}}

	// Warm-up (images unpacked on both nodes, caches warm) and the probe
	// of strategies other than stop-and-copy.
	warm, strategies, err := bed.warmup(ctx)
	if err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	rep.Warmup, rep.Strategies = warm, strategies

	var runnable []string
	for _, s := range strategies {
		if s.Available {
			runnable = append(runnable, s.Name)
		}
	}
	cell := 0
	for _, l := range cfg.LinksBps {
		if err := bed.setLinks(ctx, l); err != nil {
			return nil, err
		}
		for _, mb := range cfg.StatesMB {
			for _, r := range cfg.Rates {
				for _, s := range runnable {
					runs, samples, err := bed.cell(ctx, cell, pamCell{stateMB: mb, rate: r, linkBps: l, strategy: s}, len(rep.Runs))
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					if err != nil {
						rep.Notes = append(rep.Notes, fmt.Sprintf("cell M=%v MB R=%s L=%s %s: %v", mb, r, units.FormatRate(l), s, err))
					}
					for i, run := range runs {
						if samples[i] != nil {
							run.Sample = len(rep.Samples)
							rep.Samples = append(rep.Samples, *samples[i])
						}
						rep.Runs = append(rep.Runs, run)
					}
					cell++
				}
			}
		}
	}
	pamAnalyse(rep)
	if n := pamLoadNote(rep.Runs, runtime.NumCPU()); n != "" {
		rep.Notes = append(rep.Notes, n)
	}
	rep.DurationS = time.Since(started).Seconds()
	return rep, nil
}

// pamCell is one point of the grid.
type pamCell struct {
	stateMB  float64
	rate     string
	linkBps  uint64
	strategy string
}

// pamBed is the benchmark's running testbed.
type pamBed struct {
	cfg    PAMConfig
	log    *slog.Logger
	st     *testbed.State
	agents map[string]*api.Client // by node name
	client string                 // client namespace path
	rttMs  float64
}

func pamUp(ctx context.Context, cfg PAMConfig) (*pamBed, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bin := cfg.DPRGenBinary
	if bin == "" {
		bin = filepath.Join(filepath.Dir(cfg.Binary), image.DPRGen)
	}
	if _, err := image.BuildWorkload(ctx, image.DPRGen, image.WorkloadOptions{Root: cfg.ImageRoot, Binary: bin, Logger: log}); err != nil {
		return nil, fmt.Errorf("dprgen image: %w", err)
	}
	name := cfg.Name
	if name == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		name = "pam" + hex.EncodeToString(b)[:7]
	}
	link := testbed.Link{RateBps: cfg.LinksBps[0], Delay: cfg.LinkDelay}
	spec := testbed.Spec{Name: name,
		Nodes:   []testbed.Endpoint{{Name: "node0", Link: link}, {Name: "node1", Link: link}},
		Clients: []testbed.Endpoint{{Name: "client0", Link: testbed.Link{RateBps: 1_000_000_000, Delay: cfg.LinkDelay}}}}
	log.Info("testbed up", "name", name)
	st, err := testbed.Up(ctx, spec, testbed.Options{Root: cfg.Root, Binary: cfg.Binary, ImageRoot: cfg.ImageRoot, Log: log})
	if err != nil {
		return nil, fmt.Errorf("testbed up: %w", err)
	}
	b := &pamBed{cfg: cfg, log: log, st: st, agents: map[string]*api.Client{}, client: st.Clients[0].NetNSPath,
		rttMs: 2 * ms(2*cfg.LinkDelay)} // node0 → core → node1: both links' delay, each way
	for _, n := range st.Nodes {
		b.agents[n.Name] = api.NewUnixClient(n.Socket)
	}
	return b, nil
}

func (b *pamBed) down(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	return testbed.Down(dctx, b.cfg.Root, b.st.Name, b.log)
}

func (b *pamBed) setLinks(ctx context.Context, bps uint64) error {
	for _, n := range b.st.Nodes {
		if err := testbed.SetLink(ctx, b.cfg.Root, b.st.Name, n.Name, testbed.Link{RateBps: bps, Delay: b.cfg.LinkDelay}); err != nil {
			return fmt.Errorf("set link %s to %d bit/s: %w", n.Name, bps, err)
		}
	}
	return nil
}

// pamService is one running DPRGen container and the client's connection
// to it.
type pamService struct {
	name  string
	node  string // where it runs now
	addr  string // ip:port on the overlay
	conn  *workload.Client
	stats workload.Stats
}

// start runs a DPRGen container on node0 and waits until it answers.
func (b *pamBed) start(ctx context.Context, name string, stateMB float64, rate string) (*pamService, error) {
	node := b.st.Nodes[0].Name
	args := []string{"--state-mb", strconv.FormatFloat(stateMB, 'f', -1, 64), "--rate", rate,
		"--seed", strconv.FormatUint(b.cfg.Seed, 10), "--interval", pamInterval.String()}
	c, err := b.agents[node].Run(ctx, api.RunRequest{Name: name, Image: image.DPRGen, Args: args})
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	s := &pamService{name: name, node: node, addr: net.JoinHostPort(c.IP, strconv.Itoa(workload.DefaultPort))}
	// Filling the state takes about a second per GB.
	deadline := time.Now().Add(30*time.Second + time.Duration(stateMB/1000*float64(30*time.Second)))
	for {
		conn, err := b.dial(ctx, s.addr)
		if err == nil {
			s.conn = workload.NewClient(conn)
			break
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("dprgen %s at %s not reachable: %w", name, s.addr, err)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if s.stats, err = s.conn.Stats(ctx); err != nil {
		return s, fmt.Errorf("dprgen %s stats: %w", name, err)
	}
	return s, nil
}

// dial opens a plain TCP connection from the client's namespace.
func (b *pamBed) dial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := linux.InNetNS(b.client, func() error {
		d := &net.Dialer{Timeout: 2 * time.Second}
		d.SetMultipathTCP(false)
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

func (b *pamBed) remove(ctx context.Context, s *pamService) {
	if s.conn != nil {
		s.conn.Close()
	}
	if err := b.agents[s.node].Remove(ctx, s.name); err != nil {
		b.log.Warn("remove dprgen", "container", s.name, "node", s.node, "err", err)
	}
}

// other is the node a service on node moves to.
func (b *pamBed) other(node string) string {
	if node == b.st.Nodes[0].Name {
		return b.st.Nodes[1].Name
	}
	return b.st.Nodes[0].Name
}

// migrate moves s to the other node with strategy and verifies DPRGen's
// memory afterwards. It returns the run and, when the migration
// succeeded, its sample. An error means the service's state is unknown.
func (b *pamBed) migrate(ctx context.Context, s *pamService, strategy string, linkBps uint64) (PAMRun, *model.Sample, error) {
	run := PAMRun{Strategy: strategy, From: s.node, To: b.other(s.node), LinkBps: linkBps, Sample: -1, DirtyRate: s.stats.Rate}
	before, err := s.conn.Check(ctx)
	if err != nil || !before.OK {
		return run, nil, fmt.Errorf("check before migrating: %+v %v", before, err)
	}
	mctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	var res migration.Result
	merr := b.agents[s.node].Migrate(mctx, s.name, api.MigrateRequest{To: run.To, Strategy: strategy, LinkBps: int64(run.LinkBps)}, &res)
	cancel()
	run.DowntimeMs, run.TotalMs = res.DowntimeMs, res.TotalMs
	if merr != nil || !res.OK {
		run.Error = fmt.Sprint(merr)
		if merr == nil {
			run.Error = res.Error
		}
		if res.RolledBack || errors.Is(merr, api.ErrInvalid) {
			return run, nil, nil // the service is still where it was
		}
		return run, nil, fmt.Errorf("migration %s → %s failed: %s", run.From, run.To, run.Error)
	}
	run.OK = true
	s.node = run.To
	sample := pamSample(res, s.stats, float64(linkBps), b.rttMs)

	// Verify over the connection opened before the migration; if it did
	// not survive, say so and verify over a fresh one.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	after, cerr := s.conn.Check(cctx)
	run.ConnectionKept = cerr == nil
	if cerr != nil {
		s.conn.Close()
		conn, err := b.dial(cctx, s.addr)
		if err != nil {
			run.Check = fmt.Sprintf("unreachable after migration: %v (old connection: %v)", err, cerr)
			return run, &sample, nil
		}
		s.conn = workload.NewClient(conn)
		after, cerr = s.conn.Check(cctx)
	}
	switch {
	case cerr != nil:
		run.Check = cerr.Error()
	case after.OK && after.VersionSum < before.VersionSum:
		run.Check = fmt.Sprintf("%s: version sum went back from %d (stale state)", after.Line, before.VersionSum)
	default:
		run.Check, run.MemoryOK = after.Line, after.OK
	}
	if st, err := s.conn.Stats(cctx); err == nil {
		run.FreezesSeen = st.Gaps
	}
	return run, &sample, nil
}

// cell runs one DPRGen container through cfg.Reps migrations. Runs are
// indexed from first; samples[i] is run i's sample, nil when it failed.
func (b *pamBed) cell(ctx context.Context, n int, c pamCell, first int) (runs []PAMRun, samples []*model.Sample, err error) {
	s, err := b.start(ctx, fmt.Sprintf("dpr%d", n), c.stateMB, c.rate)
	if s != nil {
		defer b.remove(context.WithoutCancel(ctx), s)
	}
	if err != nil {
		return nil, nil, err
	}
	for rep := 0; rep < b.cfg.Reps; rep++ {
		run, sample, err := b.migrate(ctx, s, c.strategy, c.linkBps)
		run.Index, run.StateMB, run.Rate, run.Rep, run.Half = first+len(runs), c.stateMB, c.rate, rep, pamHalf(rep)
		run.Load1 = pamLoad1()
		b.log.Info("pam run", "index", run.Index, "state_mb", c.stateMB, "rate", c.rate, "link", units.FormatRate(c.linkBps),
			"strategy", c.strategy, "from", run.From, "to", run.To, "ok", run.OK, "downtime_ms", run.DowntimeMs, "check", run.Check)
		runs, samples = append(runs, run), append(samples, sample)
		if b.cfg.Progress != nil {
			b.cfg.Progress(run)
		}
		if err != nil {
			return runs, samples, err
		}
		if !run.OK {
			return runs, samples, nil // refused or rolled back: the next reps would be the same
		}
	}
	return runs, samples, nil
}

// warmup migrates a small DPRGen once with stop-and-copy (unpacking the
// image on both nodes), then tries every other requested strategy on the
// way back; a strategy the agents refuse or that fails is unavailable.
func (b *pamBed) warmup(ctx context.Context) (*PAMRun, []PAMStrategy, error) {
	s, err := b.start(ctx, "dprwarm", 10, "min")
	if s != nil {
		defer b.remove(context.WithoutCancel(ctx), s)
	}
	if err != nil {
		return nil, nil, err
	}
	warm, _, err := b.migrate(ctx, s, string(migration.StopAndCopy), b.cfg.LinksBps[0])
	warm.StateMB, warm.Rate, warm.Half, warm.Index = 10, "min", "warm-up", -1
	if err != nil {
		return &warm, nil, err
	}
	if !warm.OK {
		return &warm, nil, fmt.Errorf("stop-and-copy warm-up migration failed: %s", warm.Error)
	}
	var out []PAMStrategy
	for _, name := range b.cfg.Strategies {
		st := PAMStrategy{Name: name, Available: true}
		if name != string(migration.StopAndCopy) {
			run, _, err := b.migrate(ctx, s, name, b.cfg.LinksBps[0])
			switch {
			case err != nil:
				st.Available, st.Reason = false, "it failed without rolling back: "+err.Error()
			case !run.OK:
				st.Available, st.Reason = false, "the agent refused or failed it: "+run.Error
			case !run.MemoryOK:
				st.Available, st.Reason = false, "DPRGen's memory did not verify after it: "+run.Check
			}
		}
		out = append(out, st)
	}
	return &warm, out, nil
}

// pamLoad1 reads the 1-minute load average (0 when unreadable).
func pamLoad1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// pamLoadNote says when the machine was busier than its CPUs during the
// runs, which makes timings scatter beyond what any model predicts.
func pamLoadNote(runs []PAMRun, cpus int) string {
	var peak float64
	busy := 0
	for _, r := range runs {
		peak = math.Max(peak, r.Load1)
		if r.Load1 > float64(cpus) {
			busy++
		}
	}
	if busy == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d migrations ran with a 1-minute load average above the machine's %d CPUs (peak %.1f): other work slowed some of them", busy, len(runs), cpus, peak)
}

// pamHalf assigns a migration to a half by its repetition: the fit and
// test halves alternate, so every cell with two or more reps is in both.
func pamHalf(rep int) string {
	if rep%2 == 0 {
		return "fit"
	}
	return "test"
}

// pamSample turns an agent's migration result into a model sample. M and
// R are DPRGen's (its whole pages and its rate), not the images' size: the
// models predict from what a user knows before migrating.
func pamSample(res migration.Result, st workload.Stats, linkBps, rttMs float64) model.Sample {
	s := model.Sample{
		Strategy:     string(res.Strategy),
		Pair:         res.From + "->" + res.To,
		StateBytes:   int64(st.Pages) * workload.PageSize,
		DirtyRate:    st.Rate,
		BandwidthBps: linkBps,
		RTTMs:        rttMs,
		Compressed:   res.Compressed,
		PhasesMs:     maps.Clone(res.PhasesMs),
		DowntimeMs:   res.DowntimeMs,
		TotalMs:      res.TotalMs,
		BytesOnWire:  res.BytesOnWire,
		CRIU:         maps.Clone(res.CRIU),
	}
	if s.CRIU == nil {
		s.CRIU = map[string]float64{}
	}
	s.CRIU["payload_bytes"] = float64(res.StateBytes) // images + writable layer, for reference
	// A lazy dump leaves DPRGen's whole state for the pull. When the agent
	// does not count the pulled bytes, take them from CRIU's lazy pages or,
	// without those, from DPRGen's state, and say so.
	if _, ok := s.CRIU[model.KeyLazyBytes]; !ok && res.Strategy == migration.PostCopy {
		if n := s.CRIU[model.KeyPagesLazy]; n > 0 {
			s.CRIU[model.KeyLazyBytes] = n * workload.PageSize
		} else {
			s.CRIU[model.KeyLazyBytes] = float64(s.StateBytes)
		}
		s.CRIU[pamKeyLazyDerived] = 1
	}
	return s
}

// pamKeyLazyDerived marks a sample whose lazy_bytes the benchmark derived
// (pamSample) rather than the agent measured.
const pamKeyLazyDerived = "lazy_bytes_derived"

// pamModels are the models the benchmark compares. predict returns
// ok = false for samples the model does not describe.
var pamModels = []struct {
	name, desc string
	predict    func(fit model.FitResult, s model.Sample) (model.Prediction, bool, error)
}{
	{"edgehop", "edgehop's extended model (PAM relations at R_max, since the kernel has no soft-dirty tracking, plus network switch, link efficiency, prepare and cleanup) for the migration's own strategy, fitted on the fit half",
		func(fit model.FitResult, s model.Sample) (model.Prediction, bool, error) {
			return pamPredict(fit, model.Strategy(s.Strategy), model.Strategy(s.Strategy), s)
		}},
	{"pam-traditional", "PAM eqs. 29–30 (traditional iterative pre-copy with I = 0: a predump, then a dump whose volume follows r), its relations fitted on the fit half; stop-and-copy samples only",
		func(fit model.FitResult, s model.Sample) (model.Prediction, bool, error) {
			return pamPredict(fit, model.StopAndCopy, model.PAMTraditional, s)
		}},
	{"sota", "the network-only baseline of PAM Sec. VII-B (He et al.), I = 0; no parameters; stop-and-copy samples only",
		func(fit model.FitResult, s model.Sample) (model.Prediction, bool, error) {
			return pamPredict(fit, model.StopAndCopy, model.SotAModel, s)
		}},
	{"arnab", "ARNAB eqs. 1–7 with n = 0 (stop-and-copy), its terms mapped from the fitted set (model.ARNABFromParams); stop-and-copy samples only",
		func(fit model.FitResult, s model.Sample) (model.Prediction, bool, error) {
			return pamPredict(fit, model.StopAndCopy, model.ARNABModel, s)
		}},
}

// pamPredict predicts sample s with model m using the set fitted for
// strategy set. The published models describe eager migrations only.
func pamPredict(fit model.FitResult, set, m model.Strategy, s model.Sample) (model.Prediction, bool, error) {
	if m != model.Strategy(s.Strategy) && s.Strategy != string(model.StopAndCopy) {
		return model.Prediction{}, false, nil
	}
	p, err := fit.Lookup(pamPair, set)
	if err != nil {
		return model.Prediction{}, false, err
	}
	// R̂ is normalised per state size: R_max = ⌊M/σ⌋/ΔT (PAM Sec. IV-A),
	// not the largest rate of the whole fit.
	p.DirtyRateMax = 0
	p.DirtyIntervalMs = ms(pamInterval)
	pr, err := p.Predict(m, model.SampleInputs(s))
	return pr, err == nil, err
}

// pamRelErr is |predicted − measured| / measured in percent.
func pamRelErr(pred, meas float64) float64 {
	return math.Abs(pred-meas) / meas * 100
}

// pamErrStats summarises relative errors (percent): median and p90 by
// linear interpolation between ranks, and the maximum.
func pamErrStats(errs []float64) PAMErrStats {
	if len(errs) == 0 {
		return PAMErrStats{}
	}
	s := slices.Clone(errs)
	slices.Sort(s)
	return PAMErrStats{MedianPct: percentile(s, 0.5), P90Pct: percentile(s, 0.9), MaxPct: s[len(s)-1]}
}

// AnalysePAM recomputes a report's analysis (fit, errors, goals) from
// its runs and samples, e.g. of a report saved as JSON.
func AnalysePAM(rep *PAMReport) {
	rep.FitRuns, rep.TestRuns, rep.MemoryBad = 0, 0, 0
	rep.Models, rep.Goals, rep.Fit, rep.Predictions = nil, nil, nil, nil
	pamAnalyse(rep)
}

// pamAnalyse fits the models on the fit half and measures their error on
// the test half; it fills the report's analysis fields.
func pamAnalyse(rep *PAMReport) {
	var fitSet []model.Sample
	var test []int
	for _, r := range rep.Runs {
		if r.Sample < 0 {
			continue
		}
		if !r.MemoryOK {
			rep.MemoryBad++
		}
		if r.Half == "fit" {
			s := rep.Samples[r.Sample]
			s.Pair = pamPair
			fitSet = append(fitSet, s)
		} else {
			test = append(test, r.Sample)
		}
	}
	rep.FitRuns, rep.TestRuns = len(fitSet), len(test)
	if len(fitSet) == 0 || len(test) == 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("no model errors: %d fit and %d test samples (need both)", len(fitSet), len(test)))
		return
	}
	fit, err := model.Fit(fitSet)
	if err != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("fit: %v", err))
		return
	}
	rep.Fit = &fit
	models, preds, notes := pamEvaluate(fit, rep.Samples, test)
	rep.Models, rep.Predictions = models, preds
	rep.Notes = append(rep.Notes, notes...)
	for _, m := range models {
		if m.Model == "edgehop" {
			rep.Goals = append(rep.Goals, PAMGoal{Model: m.Model, Strategy: m.Strategy, MaxMedian: PAMGoalPct,
				DowntimeMet: m.Downtime.MedianPct <= PAMGoalPct, TotalMet: m.Total.MedianPct <= PAMGoalPct})
		}
	}
}

// pamEvaluate predicts every test sample with every model that describes
// it and summarises the relative errors per model and strategy.
func pamEvaluate(fit model.FitResult, samples []model.Sample, test []int) ([]PAMModelError, []PAMPrediction, []string) {
	var out []PAMModelError
	var preds []PAMPrediction
	var notes []string
	for _, m := range pamModels {
		byStrategy := map[string]*struct{ down, total []float64 }{}
		for _, i := range test {
			s := samples[i]
			if s.DowntimeMs <= 0 || s.TotalMs <= 0 {
				continue
			}
			pr, ok, err := m.predict(fit, s)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s on sample %d: %v", m.name, i, err))
				continue
			}
			if !ok {
				continue
			}
			p := PAMPrediction{Sample: i, Model: m.name, DowntimeMs: pr.DowntimeMs, TotalMs: pr.TotalMs,
				DowntimeErrPct: pamRelErr(pr.DowntimeMs, s.DowntimeMs), TotalErrPct: pamRelErr(pr.TotalMs, s.TotalMs)}
			preds = append(preds, p)
			acc := byStrategy[s.Strategy]
			if acc == nil {
				acc = &struct{ down, total []float64 }{}
				byStrategy[s.Strategy] = acc
			}
			acc.down = append(acc.down, p.DowntimeErrPct)
			acc.total = append(acc.total, p.TotalErrPct)
		}
		for _, st := range slices.Sorted(maps.Keys(byStrategy)) {
			acc := byStrategy[st]
			out = append(out, PAMModelError{Model: m.name, Strategy: st, Description: m.desc, N: len(acc.down),
				Downtime: pamErrStats(acc.down), Total: pamErrStats(acc.total)})
		}
	}
	return out, preds, notes
}

// WriteText renders the report for a terminal.
func (r *PAMReport) WriteText(w io.Writer) error {
	var links []string
	for _, l := range r.Grid.LinksBps {
		links = append(links, units.FormatRate(l))
	}
	fmt.Fprintf(w, "PAM benchmark on testbed %s: 2 nodes, node links %s (%.0f ms one way), DPRGen ΔT %.0f ms, %d migrations per container\n",
		r.Testbed, strings.Join(links, ", "), r.Grid.LinkDelayMs, r.Grid.IntervalMs, r.Grid.Reps)
	for _, s := range r.Strategies {
		if s.Available {
			fmt.Fprintf(w, "  %s: available\n", s.Name)
		} else {
			fmt.Fprintf(w, "  %s: unavailable (%s)\n", s.Name, s.Reason)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nRUN\tM (MB)\tR (pages/s)\tL\tSTRATEGY\tFROM→TO\tHALF\tDOWNTIME (ms)\tTOTAL (ms)\tMEMORY CHECK\tSAME CONN\tLOAD")
	for _, run := range r.Runs {
		res := fmt.Sprintf("%.1f\t%.1f", run.DowntimeMs, run.TotalMs)
		if !run.OK {
			res = "failed: " + run.Error + "\t"
		}
		fmt.Fprintf(tw, "%d\t%g\t%s %g\t%s\t%s\t%s→%s\t%s\t%s\t%s\t%v\t%.1f\n", run.Index, run.StateMB, run.Rate, run.DirtyRate, units.FormatRate(run.LinkBps),
			run.Strategy, run.From, run.To, run.Half, res, run.Check, run.ConnectionKept, run.Load1)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nfitted on %d migrations, tested on %d; DPRGen memory failed to verify in %d\n", r.FitRuns, r.TestRuns, r.MemoryBad)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tSTRATEGY\tN\tDOWNTIME ERROR median / p90 / max\tTOTAL ERROR median / p90 / max")
	for _, m := range r.Models {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f%% / %.1f%% / %.1f%%\t%.1f%% / %.1f%% / %.1f%%\n", m.Model, m.Strategy, m.N,
			m.Downtime.MedianPct, m.Downtime.P90Pct, m.Downtime.MaxPct, m.Total.MedianPct, m.Total.P90Pct, m.Total.MaxPct)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, g := range r.Goals {
		fmt.Fprintf(w, "goal (%s, %s, median ≤ %.0f%%): downtime %s, total %s\n", g.Model, g.Strategy, g.MaxMedian, metText(g.DowntimeMet), metText(g.TotalMet))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	_, err := fmt.Fprintf(w, "took %.0f s\n", r.DurationS)
	return err
}

func metText(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

// Config describes one continuity benchmark.
type Config struct {
	Root        string // testbed state root
	Binary      string // edgehop binary the testbed's agents run
	ImageRoot   string // OCI image cache ("" = image.DefaultRoot)
	ProbeBinary string // static probe binary, used only when the probe image must be built
	Name        string // testbed name; "" picks a fresh one

	Strategy migration.Strategy
	Runs     int
	Pause    time.Duration // between migrations
	Window   time.Duration // a run's gap window extends this long past its migration request

	NodeLink   testbed.Link
	ClientLink testbed.Link

	Baseline bool  // also measure the podman path
	Sweep    bool  // run the state-size sweep
	SizesMB  []int // sweep sizes

	Log *slog.Logger
}

// DefaultConfig returns the benchmark the issue describes: 10 migrations
// each way-and-back on 1 Gbit/s, 1 ms node links, against podman.
func DefaultConfig() Config {
	return Config{
		ImageRoot: image.DefaultRoot, Strategy: migration.StopAndCopy, Runs: 10,
		Pause: 300 * time.Millisecond, Window: 250 * time.Millisecond,
		NodeLink:   testbed.Link{RateBps: 1_000_000_000, Delay: time.Millisecond},
		ClientLink: testbed.Link{RateBps: 1_000_000_000, Delay: time.Millisecond},
		Baseline:   true, SizesMB: []int{10, 100, 1000},
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Root == "" || c.Binary == "" {
		errs = append(errs, errors.New("testbed root and edgehop binary are required"))
	}
	if _, err := migration.ParseStrategy(string(c.Strategy)); err != nil {
		errs = append(errs, err)
	}
	if c.Runs < 1 || c.Runs > 1000 {
		errs = append(errs, fmt.Errorf("runs %d outside 1..1000", c.Runs))
	}
	if c.Pause < 0 || c.Window < 0 || c.Window > c.Pause {
		errs = append(errs, fmt.Errorf("window %v must be between 0 and the pause %v (windows must not overlap)", c.Window, c.Pause))
	}
	for _, l := range []testbed.Link{c.NodeLink, c.ClientLink} {
		if err := l.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range c.SizesMB {
		if s < 1 || s > 64_000 {
			errs = append(errs, fmt.Errorf("sweep size %d MB outside 1..64000", s))
		}
	}
	return errors.Join(errs...)
}

// Names inside the benchmark's testbed.
const (
	probeName  = "probe"              // the edgehop-managed probe container
	probePort  = "7000"               // the probe's port (the image's default)
	podmanIP   = "10.200.250.10"      // the podman container's overlay address, outside every node's range
	redisPort  = "6379"               // redis in the sweep
	redisValue = 100_000              // bytes per redis value in the sweep
	nodeA      = 0                    // index of the first node
	nodeB      = 1                    // index of the second node
	tbPrefix   = "bc"                 // testbed names: bc + 8 hex digits
	ulimitNo   = "nofile=16384:16384" // podman: explicit limits, root here lacks CAP_SYS_RESOURCE
	ulimitProc = "nproc=4096:4096"    // (podman's defaults exceed the hard limits)
)

func redisArgs() []string {
	return []string{"redis-server", "--port", redisPort, "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"}
}

// env is a benchmark's running testbed.
type env struct {
	cfg    Config
	log    *slog.Logger
	st     *testbed.State
	agents map[string]*api.Client // every agent, core included, by node name
	client nsDialer
}

func (e *env) node(i int) testbed.Member { return e.st.Nodes[i] }

// other is the node of the two a service on node n migrates to.
func (e *env) other(n string) string {
	if n == e.node(nodeA).Name {
		return e.node(nodeB).Name
	}
	return e.node(nodeA).Name
}

// Run brings up a testbed, measures edgehop and (when cfg.Baseline) the
// podman path on it, runs the sweep when asked, tears the testbed down
// whatever happens, and returns the report. A baseline that cannot run
// here is reported as unavailable with its reason, not as an error.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	started := time.Now()
	if err := ensureImage(ctx, cfg, image.Probe); err != nil {
		return nil, err
	}
	if cfg.Sweep {
		if err := ensureImage(ctx, cfg, image.Services); err != nil {
			return nil, err
		}
	}
	e, down, err := upTestbed(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, down()) }()
	name := e.st.Name

	rep = &Report{Strategy: string(cfg.Strategy), Started: started.UTC(),
		Testbed: TestbedInfo{Name: name, NodeRateBps: cfg.NodeLink.RateBps, NodeDelayMs: ms(cfg.NodeLink.Delay),
			ClientRateBps: cfg.ClientLink.RateBps, ClientDelayMs: ms(cfg.ClientLink.Delay)},
		Workload: Workload{PeriodMs: ms(probePeriod), LineBytes: probeLineSize, Connections: 1, PauseMs: ms(cfg.Pause), WindowMs: ms(cfg.Window)}}

	log.Info("edgehop runs", "runs", cfg.Runs, "strategy", cfg.Strategy)
	side, err := e.edgehopContinuity(ctx)
	if err != nil {
		return nil, fmt.Errorf("edgehop %s: %w", cfg.Strategy, err)
	}
	rep.Side = side

	var pm *podman
	var perr error
	if cfg.Baseline || cfg.Sweep {
		if pm, perr = newPodman(ctx, e); perr == nil {
			defer func() { err = errors.Join(err, pm.close()) }()
		}
	}
	switch {
	case !cfg.Baseline:
		rep.Baseline = Side{Path: "podman checkpoint/restore", Reason: "not requested"}
	case perr != nil:
		rep.Baseline = Side{Path: "podman checkpoint/restore", Reason: perr.Error()}
	default:
		log.Info("podman runs", "runs", cfg.Runs)
		b, err := pm.continuity(ctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			b = Side{Path: pm.path(), Reason: err.Error()}
		}
		rep.Baseline = b
	}
	if rep.Baseline.Available {
		rep.Ratio = Ratio(rep.Baseline.GapMs.P50, rep.GapMs.P50)
		rep.DowntimeRatio = Ratio(rep.Baseline.DowntimeMs.P50, rep.DowntimeMs.P50)
	}

	if cfg.Sweep {
		rows, err := e.sweep(ctx, pm, perr)
		if err != nil {
			return nil, fmt.Errorf("sweep: %w", err)
		}
		rep.Sweep = rows
	}
	rep.Window = frozenWindow(rep.PerRun)
	rep.Goals = goals(rep)
	rep.Notes = notes(rep)
	rep.ElapsedS = time.Since(started).Seconds()
	return rep, nil
}

// KeepLogsEnv names the environment variable that, when set to a
// directory, makes a benchmark copy its testbed's logs (agents, link
// daemon, supervisor) to a subdirectory named after the testbed before
// tearing it down.
const KeepLogsEnv = "EDGEHOP_KEEP_LOGS"

// upTestbed brings up the benchmarks' testbed (two nodes on cfg.NodeLink,
// one client on cfg.ClientLink) and returns it with down, which tears it
// down whatever happened.
func upTestbed(ctx context.Context, cfg Config, log *slog.Logger) (*env, func() error, error) {
	name := cfg.Name
	if name == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		name = tbPrefix + hex.EncodeToString(b)
	}
	spec := testbed.Spec{Name: name,
		Nodes:   []testbed.Endpoint{{Name: "node0", Link: cfg.NodeLink}, {Name: "node1", Link: cfg.NodeLink}},
		Clients: []testbed.Endpoint{{Name: "client0", Link: cfg.ClientLink}}}
	log.Info("bringing the testbed up", "name", name)
	st, err := testbed.Up(ctx, spec, testbed.Options{Root: cfg.Root, Binary: cfg.Binary, ImageRoot: cfg.ImageRoot, Log: log})
	if err != nil {
		return nil, nil, fmt.Errorf("testbed up: %w", err)
	}
	down := func() error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if dst := os.Getenv(KeepLogsEnv); dst != "" {
			if _, err := testbed.SaveLogs(cfg.Root, name, filepath.Join(dst, name)); err != nil {
				log.Warn("keep the testbed's logs", "dir", dst, "err", err)
			}
		}
		return testbed.Down(dctx, cfg.Root, name, log)
	}
	e := &env{cfg: cfg, log: log, st: st, agents: map[string]*api.Client{"core": api.NewUnixClient(st.Core.Socket)},
		client: nsDialer{ns: st.Clients[0].NetNSPath}}
	for _, n := range st.Nodes {
		e.agents[n.Name] = api.NewUnixClient(n.Socket)
	}
	return e, down, nil
}

// warmTestbed brings up the benchmarks' testbed (upTestbed) on the given
// links, with image img built if the cache lacks it and unpacked on both
// nodes, so that no migration pays for unpacking it at its destination.
func warmTestbed(ctx context.Context, root, binary, imageRoot string, nodeLink, clientLink testbed.Link, img string, log *slog.Logger) (*env, func() error, error) {
	bc := DefaultConfig()
	bc.Root, bc.Binary, bc.ImageRoot, bc.Log = root, binary, imageRoot, log
	bc.NodeLink, bc.ClientLink = nodeLink, clientLink
	if err := ensureImage(ctx, bc, img); err != nil {
		return nil, nil, err
	}
	e, down, err := upTestbed(ctx, bc, log)
	if err != nil {
		return nil, nil, err
	}
	for i := range e.st.Nodes {
		if err := e.warm(ctx, i, img); err != nil {
			return nil, nil, errors.Join(err, down())
		}
	}
	return e, down, nil
}

// testbedInfo describes the testbed's links for a report.
func (e *env) testbedInfo() TestbedInfo {
	return TestbedInfo{Name: e.st.Name, NodeRateBps: e.cfg.NodeLink.RateBps, NodeDelayMs: ms(e.cfg.NodeLink.Delay),
		ClientRateBps: e.cfg.ClientLink.RateBps, ClientDelayMs: ms(e.cfg.ClientLink.Delay)}
}

// ensureImage builds a built-in image when the cache lacks it.
func ensureImage(ctx context.Context, cfg Config, name string) error {
	if _, err := image.Resolve(cfg.ImageRoot, name); err == nil {
		return nil
	}
	_, err := image.Build(ctx, name, image.BuildOptions{Root: cfg.ImageRoot, ProbeBinary: cfg.ProbeBinary, Logger: cfg.Log})
	if err != nil {
		return fmt.Errorf("image %s missing and could not be built: %w", name, err)
	}
	return nil
}

// edgehopContinuity runs the probe under edgehop and migrates it back and
// forth cfg.Runs times.
func (e *env) edgehopContinuity(ctx context.Context) (Side, error) {
	side := Side{Path: "edgehop " + string(e.cfg.Strategy)}
	loc := e.node(nodeA).Name
	c, err := e.agents[loc].Run(ctx, api.RunRequest{Name: probeName, Image: image.Probe, Args: []string{probePort}})
	if err != nil {
		return side, fmt.Errorf("run probe: %w", err)
	}
	addr := net.JoinHostPort(c.IP, probePort)
	if err := waitListening(ctx, e.client, addr, 10*time.Second); err != nil {
		return side, err
	}
	pr := newProber(addr, e.client)
	pr.start(ctx)
	stopped := false
	defer func() {
		if !stopped {
			_, _ = pr.stop()
		}
	}()
	if err := sleep(ctx, e.cfg.Pause); err != nil {
		return side, err
	}
	var runs []Migration
	for i := 0; i < e.cfg.Runs; i++ {
		to := e.other(loc)
		r := Migration{Index: i, From: loc, To: to, start: time.Now()}
		var res migration.Result
		merr := e.agents[loc].Migrate(ctx, probeName, api.MigrateRequest{To: to, Strategy: string(e.cfg.Strategy), LinkBps: int64(e.st.PathRate(loc, to))}, &res)
		r.end = time.Now()
		if ctx.Err() != nil {
			return side, ctx.Err()
		}
		switch {
		case merr != nil: // refused before starting (e.g. an unavailable strategy) or agent unreachable
			return side, fmt.Errorf("migration %d %s -> %s: %w", i, r.From, to, merr)
		case res.OK:
			loc = to
		case !res.RolledBack:
			return side, fmt.Errorf("migration %d %s -> %s failed without rollback (service lost): %s", i, r.From, to, res.Error)
		}
		r.OK, r.Error = res.OK, res.Error
		r.DowntimeMs, r.TotalMs, r.PhasesMs, r.BytesOnWire, r.CRIU = res.DowntimeMs, res.TotalMs, res.PhasesMs, res.BytesOnWire, res.CRIU
		r.Restore = res.Destination
		rec, err := pr.recovered(ctx, r.end, recoverTimeout)
		r.Reconnected = rec
		if err != nil {
			return side, fmt.Errorf("after migration %d: %w", i, err)
		}
		runs = append(runs, r)
		e.log.Info("edgehop migration", "run", i, "to", to, "ok", r.OK, "downtime_ms", r.DowntimeMs)
		if err := sleep(ctx, e.cfg.Pause); err != nil {
			return side, err
		}
	}
	obs, err := pr.stop()
	stopped = true
	if err != nil {
		return side, err
	}
	side = summarize(side, runs, obs, e.cfg.Window)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := e.agents[loc].Remove(rctx, probeName); err != nil {
		e.log.Warn("remove probe", "err", err)
	}
	return side, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// notes are the caveats a reader of the numbers needs.
func notes(r *Report) []string {
	n := []string{
		"gap: longest interval without a probe reply (one TCP connection, a 64-byte request every 5 ms from the client namespace) overlapping the migration request and the window after it",
		"downtime: edgehop = freeze to network switched, as its agents record it; podman = start of 'podman container checkpoint' to the FDB switch after 'podman container restore'",
		"lost_bytes: request bytes that got no correct reply (unanswered when a connection ended, or answered with a wrong byte count/CRC)",
	}
	if r.Baseline.Available {
		n = append(n,
			"podman path: checkpoint --tcp-established --export (podman's default zstd archive) on a tmpfs, the archive sent node to node over the shaped link by a plain TCP copy, restore --tcp-established --import into a namespace with the same IP/MAC and CRIU's lock chain prepared before the freeze, then the same FDB switch edgehop uses",
			"podman's image and container storage is host-global: the destination never fetches the image (a shortcut a real second host would not get); while the archive travels, the source's veth and container are removed (the 'rm' phase is only what outlasts the transfer), since podman cannot restore --tcp-established under a new name",
		)
	}
	n = append(n, "a client's TCP retransmission back-off (RTO at least 200 ms, doubling) decides when it next reaches a restored service, so the gap can be longer than the downtime; and before the FDB switch, traffic can already reach the destination through the source node's flooding once the source's veth is gone, so it can also be shorter")
	if len(r.Sweep) > 0 {
		n = append(n, "sweep: redis filled from the client with random (incompressible) 100 kB values; the services image unpacked on both edgehop nodes before measuring, as podman's host-global storage never needs to; one migration per size and path, node0 -> node1 (edgehop post-copy back)")
	}
	for _, s := range []Side{r.Side, r.Baseline} {
		if s.Available && s.Probe.Connections > 1 {
			n = append(n, fmt.Sprintf("%s: the probe needed %d connections (%d resets, %d other errors, or a connection silent for %v); each new one was opened after a migration, and that migration's gap runs until its first reply",
				s.Path, s.Probe.Connections, s.Resets, s.ConnErrors, recoverTimeout))
		}
	}
	return n
}

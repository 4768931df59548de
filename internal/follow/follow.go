package follow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/controller"
	"github.com/edgehop/edgehop/internal/mobility"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/topo"
	"github.com/edgehop/edgehop/internal/world"
)

// Config describes one follow-the-user run.
type Config struct {
	Root      string // testbed state root
	Binary    string // edgehop binary the testbed runs
	ImageRoot string
	Name      string // testbed name
	Nodes     int    // one region each, node<i> at its middle
	APsPer    int    // access points per region
	Width     float64
	// Speed is how fast the user walks from the start of the first region
	// to the end of the last (metres per second).
	Speed float64
	// Walk is the user's path: WalkLine (default) from the start of the
	// first region to the end of the last, or WalkBorder: to the border
	// between the first two regions, then back and forth across it.
	Walk   string
	Policy policy.Config
	// Keys of ValueSize bytes preloaded in each redis; Conns connections
	// of load each.
	Keys, ValueSize, Conns int
	Model                  world.Model
	// Sequential measures the three placements on three walks, one at a
	// time, so their loads do not share the machine; otherwise at once.
	Sequential bool
	// Pod, when set, makes the followed redis the first member of a pod of
	// that name, with a replica in its namespace (port 6380, replicating
	// over loopback): the controller follows the pod, which moves as one,
	// and the replica must hold every key at the end.
	Pod string
	// ReportDir receives report.json and report.html ("" : none).
	ReportDir string
	Progress  func(line string)
	Log       *slog.Logger
}

// DemoConfig is `edgehop demo`: 3 regions, 6 access points, 3 nodes; the
// user walks 900 m at 10 m/s under the latency policy.
func DemoConfig() Config {
	return Config{Name: "demo", Nodes: 3, APsPer: 2, Width: 300, Speed: 10, Keys: 20_000, ValueSize: 1000, Conns: 4,
		Model: world.DefaultModel(), Policy: policy.Config{Kind: policy.KindLatency, ThresholdMs: 5, MinDwell: 10 * time.Second}}
}

// The walks a run can take.
const (
	WalkLine   = "line"
	WalkBorder = "border"
	// BorderSwing is how far a border walk strays to each side of the
	// border, and BorderLegs how many times it crosses it: ±48 m, a
	// 1 ms RTT difference to the two nodes at each end on the default
	// model (2 ms per 100 m round trip), enough for an undamped policy
	// to flip the service at every crossing.
	BorderSwing = 48.0
	BorderLegs  = 10
)

// trace is the walk cfg describes, and its length in metres.
func (c Config) trace() (mobility.Trace, float64) {
	start := topo.Point{X: 0}
	if c.Walk != WalkBorder {
		t := mobility.Walk(start, topo.Point{X: float64(c.Nodes) * c.Width}, c.Speed)
		return t, t.Length()
	}
	// From the first node's side of its region to the border, then
	// across and back BorderLegs times.
	start = topo.Point{X: c.Width / 2}
	t := mobility.Trace{Start: start}
	border := c.Width
	t.Waypoints = append(t.Waypoints, mobility.Waypoint{Pos: topo.Point{X: border - BorderSwing}, Speed: c.Speed})
	for i := 0; i < BorderLegs; i++ {
		x := border + BorderSwing
		if i%2 == 1 {
			x = border - BorderSwing
		}
		t.Waypoints = append(t.Waypoints, mobility.Waypoint{Pos: topo.Point{X: x}, Speed: c.Speed})
	}
	return t, t.Length()
}

// service is the name the controller follows: the redis, or its pod.
func (c Config) service() string {
	if c.Pod != "" {
		return c.Pod
	}
	return followed
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Root == "" || c.Binary == "" {
		errs = append(errs, errors.New("root and binary are required"))
	}
	if c.Nodes < 2 || c.APsPer < 1 || c.Width <= 0 || c.Speed <= 0 {
		errs = append(errs, fmt.Errorf("want 2+ nodes, 1+ APs per region, a positive width and speed (got %d, %d, %v, %v)", c.Nodes, c.APsPer, c.Width, c.Speed))
	}
	if c.Walk != "" && c.Walk != WalkLine && c.Walk != WalkBorder {
		errs = append(errs, fmt.Errorf("unknown walk %q: want %s or %s", c.Walk, WalkLine, WalkBorder))
	}
	if c.Pod != "" && (c.Pod == followed || c.Pod == fixedOrig || c.Pod == fixedDest || c.Pod == replica) {
		errs = append(errs, fmt.Errorf("pod name %q is taken by one of the experiment's containers", c.Pod))
	}
	if c.Keys < 1 || c.ValueSize < 16 || c.Conns < 1 {
		errs = append(errs, errors.New("want keys ≥ 1, value size ≥ 16, conns ≥ 1"))
	}
	if err := c.Policy.WithDefaults().Validate(); err != nil && !(c.Policy.Kind == policy.KindThroughput && c.Policy.MinOps == 0) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Report is what a run shows.
type Report struct {
	Testbed string        `json:"testbed"`
	Policy  policy.Config `json:"policy"`
	// Service is what the controller followed: the redis, or its pod.
	Service     string      `json:"service"`
	Walk        string      `json:"walk,omitempty"`
	WalkMetres  float64     `json:"walk_m"`
	WalkSeconds float64     `json:"walk_s"`
	Migrations  []Migration `json:"migrations"`
	Handoffs    []Handoff   `json:"handoffs"`
	Decisions   int         `json:"decisions_logged"`
	// ReturnsHeld counts the logged decisions in which the policy wanted
	// the service back on the node it had just left and the ping-pong
	// guard held it.
	ReturnsHeld  int                 `json:"returns_held"`
	ClientErrors int                 `json:"client_errors"`
	ErrorSamples []string            `json:"client_error_samples,omitempty"`
	Throughput   Throughput          `json:"throughput"`
	LatencyMs    Throughput          `json:"latency_ms"`
	GainPct      Gain                `json:"gain_pct"`
	DataVerified bool                `json:"data_verified"`
	Series       map[string][]Sample `json:"series"`
	Track        []TrackPoint        `json:"track"`
	ReportJSON   string              `json:"report_json,omitempty"`
	ReportHTML   string              `json:"report_html,omitempty"`
	Started      time.Time           `json:"started"`
	// Sequential: the three placements were measured on three walks, one
	// at a time; otherwise at once, on one walk.
	Sequential bool    `json:"sequential"`
	ElapsedS   float64 `json:"elapsed_s"`
}

// Migration is one migration the controller made.
type Migration struct {
	T          float64 `json:"t_s"`
	Service    string  `json:"service"`
	From       string  `json:"from"`
	To         string  `json:"to"`
	Strategy   string  `json:"strategy"`
	DowntimeMs float64 `json:"downtime_ms"`
	TotalMs    float64 `json:"total_ms"`
	OK         bool    `json:"ok"`
	Policy     string  `json:"policy"`
	Reason     string  `json:"reason"`
	Error      string  `json:"error,omitempty"`
}

// Handoff is one tier-1 handoff.
type Handoff struct {
	T              float64 `json:"t_s"`
	User           string  `json:"user"`
	FromAP         string  `json:"from_ap"`
	ToAP           string  `json:"to_ap"`
	InterruptionMs float64 `json:"interruption_ms"`
}

// Throughput compares the followed service with the two fixed placements.
type Throughput struct {
	WithMigration    float64 `json:"with_migration"`
	FixedOrigin      float64 `json:"fixed_origin"`
	FixedDestination float64 `json:"fixed_destination"`
}

// Gain is the followed service's throughput over each fixed placement.
type Gain struct {
	VsOrigin      float64 `json:"vs_origin"`
	VsDestination float64 `json:"vs_destination"`
}

// TrackPoint is where the user was and what served it.
type TrackPoint struct {
	T    float64 `json:"t_s"`
	X    float64 `json:"x"`
	Y    float64 `json:"y"`
	AP   string  `json:"ap"`
	Node string  `json:"node"`
}

// Names of the redis instances.
const (
	followed    = "redis"         // follows the user
	fixedOrig   = "redis-origin"  // stays on the first node
	fixedDest   = "redis-dest"    // stays on the last node
	replica     = "redis-replica" // with Config.Pod: the followed one's replica, in its pod
	replicaPort = "6380"
	user        = "client0"
	redisPort   = "6379"
)

// Run brings up a testbed, runs the experiment, writes the report and
// tears the testbed down whatever happens.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("follow: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	say := func(format string, args ...any) {
		if cfg.Progress != nil {
			cfg.Progress(fmt.Sprintf(format, args...))
		}
	}
	spec := testbed.Spec{Name: cfg.Name}
	for i := 0; i < cfg.Nodes; i++ {
		spec.Nodes = append(spec.Nodes, testbed.Endpoint{Name: fmt.Sprintf("node%d", i), Link: cfg.Model.NodeLink(0)})
		for a := 0; a < cfg.APsPer; a++ {
			spec.APs = append(spec.APs, testbed.Endpoint{Name: fmt.Sprintf("ap%d", i*cfg.APsPer+a), Link: testbed.Link{RateBps: 1_000_000_000, Delay: 100 * time.Microsecond}})
		}
	}
	spec.Clients = []testbed.Endpoint{{Name: user, Link: cfg.Model.AccessLink(0), AP: "ap0"}}
	plane := topo.Line(cfg.Nodes, cfg.APsPer, cfg.Width)
	for i := range plane.Nodes {
		plane.Nodes[i].Name = fmt.Sprintf("node%d", i)
	}
	spec.Plane = &plane
	say("bringing up a testbed: %d regions, %d access points, %d nodes", cfg.Nodes, len(spec.APs), cfg.Nodes)
	started := time.Now()
	if _, serr := testbed.Load(cfg.Root, cfg.Name); serr == nil {
		return nil, fmt.Errorf("follow: testbed %q is up already (run 'edgehop testbed down --testbed %s')", cfg.Name, cfg.Name)
	}
	st, err := testbed.Up(ctx, spec, testbed.Options{Root: cfg.Root, Binary: cfg.Binary, ImageRoot: cfg.ImageRoot, Log: log})
	if err != nil {
		return nil, err
	}
	defer func() {
		say("tearing the testbed down")
		if derr := testbed.Down(context.WithoutCancel(ctx), cfg.Root, cfg.Name, log); derr != nil {
			err = errors.Join(err, derr)
		}
	}()
	ctl, err := st.Controller.Client()
	if err != nil {
		return nil, err
	}
	origin, dest := st.Nodes[0], st.Nodes[len(st.Nodes)-1]
	client := st.Clients[0]

	// The services, each with its data.
	args := []string{"redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"}
	addrs := map[string]string{}
	service := cfg.service()
	for _, s := range []struct{ name, node, sock string }{{followed, origin.Name, origin.Socket}, {fixedOrig, origin.Name, origin.Socket}, {fixedDest, dest.Name, dest.Socket}} {
		req := api.RunRequest{Name: s.name, Image: "services", Args: args}
		if s.name == followed && cfg.Pod != "" {
			req.Pod = cfg.Pod
		}
		c, err := api.NewUnixClient(s.sock).Run(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("run %s on %s: %w", s.name, s.node, err)
		}
		addrs[s.name] = c.IP + ":" + redisPort
	}
	var replicaAddr string
	if cfg.Pod != "" {
		// The replica freezes before the redis it depends on.
		c, err := api.NewUnixClient(origin.Socket).Run(ctx, api.RunRequest{Name: replica, Image: "services", Pod: cfg.Pod, After: []string{followed},
			Args: append(slices.Clone(args), "--port", replicaPort, "--replicaof", "127.0.0.1", redisPort)})
		if err != nil {
			return nil, fmt.Errorf("run %s in pod %s on %s: %w", replica, cfg.Pod, origin.Name, err)
		}
		replicaAddr = c.IP + ":" + replicaPort
		say("pod %s: %s and its replica %s share one address (%s)", cfg.Pod, followed, replica, c.IP)
	}
	say("preloading %d keys of %d bytes into each redis", cfg.Keys, cfg.ValueSize)
	for name, addr := range addrs {
		if err := waitRedis(ctx, client.NetNSPath, addr); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := Preload(ctx, client.NetNSPath, addr, cfg.Keys, cfg.ValueSize); err != nil {
			return nil, fmt.Errorf("preload %s: %w", name, err)
		}
	}
	// The links as they are at the walk's start, before the agents
	// measure anything: the first RTTs the policy sees must be the
	// distances', not the testbed's defaults.
	walk, walkLen := cfg.trace()
	start := walk.Start
	if err := world.Place(ctx, world.Config{Root: cfg.Root, Testbed: cfg.Name, Plane: plane, Model: cfg.Model},
		map[string]topo.Point{user: start}); err != nil {
		return nil, err
	}
	// The controller learns the user and the service it follows; the
	// agents start measuring their RTT to the user's device.
	if _, err := ctl.AddUser(ctx, controller.AddUserRequest{Name: user, Address: client.Address, Pos: start}); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	pc := cfg.Policy
	if pc.Kind == policy.KindThroughput && pc.MinOps == 0 {
		// H-Container migrates "when the throughput falls under a
		// certain threshold": half of what the user sees next to the
		// origin, measured now.
		base, err := measureOps(ctx, client.NetNSPath, addrs[followed], cfg)
		if err != nil {
			return nil, err
		}
		pc.MinOps = base / 2
		say("throughput next to the origin: %.0f op/s; the policy migrates under %.0f op/s", base, pc.MinOps)
	}
	rep = &Report{Testbed: cfg.Name, Policy: pc, Service: service, Walk: cfg.Walk, WalkMetres: walkLen, WalkSeconds: walk.Duration().Seconds(),
		Started: started.UTC(), Sequential: cfg.Sequential, Series: map[string][]Sample{}}
	follow := func() error {
		if _, err := ctl.AddService(ctx, controller.AddServiceRequest{Name: service, User: user, Node: origin.Name, Policy: pc}); err != nil {
			return fmt.Errorf("controller: %w", err)
		}
		return waitMeasured(ctx, ctl, cfg.Nodes)
	}
	// The loads run from the user's device for the whole walk: all three
	// at once, or (Sequential) one walk each, the followed one last so the
	// controller follows only during its own walk.
	groups := [][]string{{followed, fixedOrig, fixedDest}}
	if cfg.Sequential {
		groups = [][]string{{fixedOrig}, {fixedDest}, {followed}}
	}
	var t0 time.Time
	var track []TrackPoint
	verifiers := map[string]*Load{}
	for _, names := range groups {
		if names[0] == followed {
			if err := follow(); err != nil {
				return nil, err
			}
		}
		if len(groups) > 1 {
			say("walk with redis %s", names[0])
		}
		var lerr error
		var loads map[string]*Load
		t0, track, loads, lerr = walkOnce(ctx, cfg, ctl, plane, walk, client.NetNSPath, addrs, names, say)
		for name, l := range loads {
			verifiers[name] = l
			rep.Series[name] = l.Series()
			for _, e := range l.Errors() {
				rep.ClientErrors++
				if len(rep.ErrorSamples) < 10 {
					rep.ErrorSamples = append(rep.ErrorSamples, name+": "+e)
				}
			}
		}
		if lerr != nil {
			return rep, lerr
		}
	}
	rep.Track = track
	walkEnd := walk.Duration().Seconds()
	rep.Throughput = Throughput{WithMigration: meanOps(rep.Series[followed], walkEnd), FixedOrigin: meanOps(rep.Series[fixedOrig], walkEnd), FixedDestination: meanOps(rep.Series[fixedDest], walkEnd)}
	rep.LatencyMs = Throughput{WithMigration: meanLat(rep.Series[followed], walkEnd), FixedOrigin: meanLat(rep.Series[fixedOrig], walkEnd), FixedDestination: meanLat(rep.Series[fixedDest], walkEnd)}
	rep.GainPct = Gain{VsOrigin: pct(rep.Throughput.WithMigration, rep.Throughput.FixedOrigin), VsDestination: pct(rep.Throughput.WithMigration, rep.Throughput.FixedDestination)}
	// The data: every key preloaded or acknowledged is there.
	rep.DataVerified = true
	for name, l := range verifiers {
		if verr := l.Verify(ctx, client.NetNSPath, addrs[name], cfg.Keys, cfg.ValueSize); verr != nil {
			rep.DataVerified = false
			err = errors.Join(err, verr)
		}
	}
	if l, ok := verifiers[followed]; ok && replicaAddr != "" {
		// The replica, replicating over the pod's loopback through every
		// migration, holds the same keys once it has caught up.
		if verr := verifyReplica(ctx, l, client.NetNSPath, replicaAddr, cfg); verr != nil {
			rep.DataVerified = false
			err = errors.Join(err, fmt.Errorf("replica %s: %w", replica, verr))
		}
	}
	if herr := history(ctx, ctl, t0, rep); herr != nil {
		err = errors.Join(err, herr)
	}
	rep.ElapsedS = time.Since(started).Seconds()
	if cfg.ReportDir != "" {
		if werr := write(cfg.ReportDir, rep); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return rep, err
}

func pct(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return (a/b - 1) * 100
}

// meanOps is the average throughput over the walk's samples.
func meanOps(s []Sample, until float64) float64 {
	var sum float64
	n := 0
	for _, x := range s {
		if x.T <= until+1 {
			sum += x.Ops
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

func meanLat(s []Sample, until float64) float64 {
	var sum, ops float64
	for _, x := range s {
		if x.T <= until+1 && x.Ops > 0 {
			sum += x.LatencyMs * x.Ops
			ops += x.Ops
		}
	}
	if ops == 0 {
		return 0
	}
	return sum / ops
}

// verifyReplica waits, up to a minute, for the replica at addr to hold
// every key l wrote to the redis it replicates.
func verifyReplica(ctx context.Context, l *Load, ns, addr string, cfg Config) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := l.Verify(ctx, ns, addr, cfg.Keys, cfg.ValueSize)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// reportLoop sends the followed service's throughput and latency to the
// controller every second, as the user's device would.
func reportLoop(ctx context.Context, ctl *controller.Client, l *Load) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := l.Series()
		if len(s) == 0 {
			continue
		}
		last := s[len(s)-1]
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, _ = ctl.Report(rctx, user, last.Ops, last.LatencyMs)
		cancel()
	}
}

// measureOps runs the load on addr for three seconds and returns its
// throughput.
func measureOps(ctx context.Context, ns, addr string, cfg Config) (float64, error) {
	mctx, cancel := context.WithTimeout(ctx, 3500*time.Millisecond)
	defer cancel()
	l := &Load{Name: "calibration"}
	if err := l.Run(mctx, ns, addr, cfg.Conns, cfg.Keys, cfg.ValueSize, time.Now()); err != nil {
		return 0, err
	}
	s := l.Series()
	if len(s) < 2 {
		return 0, errors.New("calibration: no throughput measured")
	}
	return meanOps(s[1:], 1e9), nil
}

func waitRedis(ctx context.Context, ns, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := dial(ctx, ns, addr)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis at %s not answering: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMeasured waits until every node reports an RTT to the user.
func waitMeasured(ctx context.Context, ctl *controller.Client, nodes int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		us, err := ctl.Users(ctx)
		if err == nil && len(us) == 1 && len(us[0].RTTMs) >= nodes {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agents measure no RTT to the user (users: %+v, %v)", us, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitIdle waits until no migration is under way.
func waitIdle(ctx context.Context, ctl *controller.Client, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		ss, err := ctl.Services(ctx)
		busy := err != nil
		for _, s := range ss {
			busy = busy || s.Migrating != ""
		}
		if !busy {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// history copies the controller's migrations and handoffs into rep.
func history(ctx context.Context, ctl *controller.Client, t0 time.Time, rep *Report) error {
	ms, err := ctl.History(ctx, controller.KindMigrations, 1000)
	if err != nil {
		return err
	}
	for _, e := range ms {
		var m controller.MigrationRecord
		if json.Unmarshal(e.Data, &m) != nil {
			continue
		}
		rep.Migrations = append(rep.Migrations, Migration{T: m.Time.Sub(t0).Seconds(), Service: m.Service, From: m.From, To: m.To, Strategy: m.Strategy,
			DowntimeMs: m.DowntimeMs, TotalMs: m.TotalMs, OK: m.OK, Policy: m.Policy, Reason: m.Reason, Error: m.Error})
	}
	hs, err := ctl.History(ctx, controller.KindHandoffs, 1000)
	if err != nil {
		return err
	}
	for _, e := range hs {
		var h controller.Handoff
		if json.Unmarshal(e.Data, &h) != nil || h.FromAP == "" {
			continue // the first attachment is not a handoff
		}
		rep.Handoffs = append(rep.Handoffs, Handoff{T: h.Time.Sub(t0).Seconds(), User: h.User, FromAP: h.FromAP, ToAP: h.ToAP, InterruptionMs: h.InterruptionMs})
	}
	ds, err := ctl.History(ctx, controller.KindDecisions, 10000)
	if err == nil {
		rep.Decisions = len(ds)
		for _, e := range ds {
			var d controller.DecisionRecord
			if json.Unmarshal(e.Data, &d) == nil && d.Return && !d.Migrate {
				rep.ReturnsHeld++
			}
		}
	}
	sort.Slice(rep.Migrations, func(i, j int) bool { return rep.Migrations[i].T < rep.Migrations[j].T })
	sort.Slice(rep.Handoffs, func(i, j int) bool { return rep.Handoffs[i].T < rep.Handoffs[j].T })
	return nil
}

// write stores report.json and report.html in dir.
func write(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rep.ReportJSON = filepath.Join(dir, "report.json")
	rep.ReportHTML = filepath.Join(dir, "report.html")
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(rep.ReportJSON, b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(rep.ReportHTML, []byte(HTML(rep)), 0o644)
}

// Summary is the report's short text for a terminal.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "walked %.0f m in %.0f s under the %s policy\n", r.WalkMetres, r.WalkSeconds, r.Policy.Kind)
	for _, h := range r.Handoffs {
		fmt.Fprintf(&b, "  handoff   t=%5.1fs  %s: %s -> %s, link down %.1f ms\n", h.T, h.User, h.FromAP, h.ToAP, h.InterruptionMs)
	}
	for _, m := range r.Migrations {
		state := "ok"
		if !m.OK {
			state = "FAILED: " + m.Error
		}
		fmt.Fprintf(&b, "  migration t=%5.1fs  %s: %s -> %s (%s) downtime %.0f ms, %s; %s\n", m.T, m.Service, m.From, m.To, m.Strategy, m.DowntimeMs, state, m.Reason)
	}
	fmt.Fprintf(&b, "throughput (op/s): following the user %.0f, fixed at the origin %.0f (%+.1f%%), fixed at the destination %.0f (%+.1f%%)\n",
		r.Throughput.WithMigration, r.Throughput.FixedOrigin, r.GainPct.VsOrigin, r.Throughput.FixedDestination, r.GainPct.VsDestination)
	fmt.Fprintf(&b, "mean latency (ms): %.2f following, %.2f at the origin, %.2f at the destination\n", r.LatencyMs.WithMigration, r.LatencyMs.FixedOrigin, r.LatencyMs.FixedDestination)
	fmt.Fprintf(&b, "client errors: %d; data verified: %t\n", r.ClientErrors, r.DataVerified)
	if r.ReportHTML != "" {
		fmt.Fprintf(&b, "report: %s (and %s)\n", r.ReportHTML, r.ReportJSON)
	}
	return b.String()
}

// BenchConfig is `edgehop bench follow`, H-Container's Fig. 17 on the
// testbed: two nodes 1 km apart (origin and destination), the user walking
// from one to the other at 10 m/s while the latency to each node follows
// the distance (1 ms per 100 m, H-Container's +1 ms per step to 10 ms),
// redis following under the throughput policy (H-Container: migrate when
// the throughput falls under a threshold; here half of what the user sees
// next to the origin).
//
// As in H-Container, only the distance to the node adds latency: the
// access link and the nodes' base delay are left at zero, so the user sees
// the path's own RTT next to a node and 20 ms more 1 km away.
func BenchConfig() Config {
	m := world.DefaultModel()
	m.NodeBase, m.AccessBase, m.AccessPer100m = 0, 0, 0
	return Config{Name: "follow", Nodes: 2, APsPer: 2, Width: 500, Speed: 10, Keys: 20_000, ValueSize: 1000, Conns: 4, Sequential: true,
		Model: m, Policy: policy.Config{Kind: policy.KindThroughput, MinDwell: 5 * time.Second}}
}

// walkOnce walks the user once with a load on each of names and returns
// the walk's time origin, the track and the loads (stopped).
func walkOnce(ctx context.Context, cfg Config, ctl *controller.Client, plane topo.Topology, walk mobility.Trace, ns string,
	addrs map[string]string, names []string, say func(string, ...any)) (time.Time, []TrackPoint, map[string]*Load, error) {
	t0 := time.Now()
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loads := map[string]*Load{}
	var wg sync.WaitGroup
	errc := make(chan error, len(names))
	for _, name := range names {
		l := &Load{Name: name}
		loads[name] = l
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Run(lctx, ns, addrs[name], cfg.Conns, cfg.Keys, cfg.ValueSize, t0); err != nil {
				errc <- err
			}
		}()
	}
	shown := names[0]
	if l, ok := loads[followed]; ok {
		shown = followed
		// The device reports what it measures of the followed service.
		wg.Add(1)
		go func() {
			defer wg.Done()
			reportLoop(lctx, ctl, l)
		}()
	}
	var track []TrackPoint
	werr := world.Run(ctx, world.Config{Root: cfg.Root, Testbed: cfg.Name, Plane: plane, Model: cfg.Model,
		Users: map[string]mobility.Trace{user: walk}, Controller: ctl, Tick: 500 * time.Millisecond,
		OnTick: func(el time.Duration, pos map[string]topo.Point) {
			p := pos[user]
			tp := TrackPoint{T: el.Seconds(), X: p.X, Y: p.Y}
			if u, err := ctl.Users(ctx); err == nil && len(u) > 0 {
				tp.AP = u[0].AP
			}
			if ss, err := ctl.Services(ctx); err == nil {
				for _, s := range ss {
					if s.Name == cfg.service() {
						tp.Node = s.Node
						if s.Migrating != "" {
							tp.Node += " (migrating)"
						}
					}
				}
			}
			track = append(track, tp)
			last := loads[shown].Series()
			ops := 0.0
			if len(last) > 0 {
				ops = last[len(last)-1].Ops
			}
			say("t=%5.1fs  user at x=%4.0f m on %-4s  redis on %-16s %6.0f op/s", tp.T, p.X, tp.AP, tp.Node, ops)
		}})
	// A migration under way when the walk ends finishes before the load
	// stops.
	waitIdle(ctx, ctl, 2*time.Minute)
	stopLoad()
	wg.Wait()
	close(errc)
	var err error
	for e := range errc {
		err = errors.Join(err, e)
	}
	return t0, track, loads, errors.Join(err, werr)
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/edgehop/edgehop/internal/controller"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/topo"
)

// ControllerConfig describes `edgehop bench controller`: the controller's
// decision loop driven with simulated measurements, no namespaces.
type ControllerConfig struct {
	Nodes    int
	Users    int
	Duration time.Duration // of the measured run, after a warm-up of users/10 updates
	Cores    int           // GOMAXPROCS during the run (1: "on one core")
	Seed     uint64
}

// DefaultControllerConfig is the goal's setting: 1,000 nodes, 100,000
// users, one update per user per second, one core.
func DefaultControllerConfig() ControllerConfig {
	return ControllerConfig{Nodes: 1000, Users: 100_000, Duration: 10 * time.Second, Cores: 1, Seed: 1}
}

// Validate checks the configuration.
func (c ControllerConfig) Validate() error {
	var errs []error
	if c.Nodes < 1 || c.Nodes > 100_000 {
		errs = append(errs, fmt.Errorf("nodes %d outside 1..100000", c.Nodes))
	}
	if c.Users < 1 || c.Users > 10_000_000 {
		errs = append(errs, fmt.Errorf("users %d outside 1..10000000", c.Users))
	}
	if c.Duration < time.Second {
		errs = append(errs, fmt.Errorf("duration %v under a second", c.Duration))
	}
	if c.Cores < 1 {
		errs = append(errs, fmt.Errorf("cores %d < 1", c.Cores))
	}
	return errors.Join(errs...)
}

// ControllerReport is the result.
type ControllerReport struct {
	Nodes      int              `json:"nodes"`
	Users      int              `json:"users"`
	Cores      int              `json:"cores"`
	DurationS  float64          `json:"duration_s"`
	Updates    int64            `json:"updates"`
	UpdatesPS  float64          `json:"updates_per_s"`
	OfferedPS  float64          `json:"offered_per_s"` // one per user per second
	DecisionMs Summary          `json:"decision_ms"`   // from an update's due time to its decisions
	Handoffs   int64            `json:"handoffs"`
	Migrations int64            `json:"migrations"`
	ByPolicy   map[string]int64 `json:"migrations_by_policy"`
	Goal       string           `json:"goal"`
	GoalMet    bool             `json:"goal_met"`
}

// RunController builds a grid deployment of cfg.Nodes nodes (1 km apart,
// two access points each, rows of nodes as regions) and cfg.Users users,
// each followed by one service under one of the five policies in turn;
// then, for cfg.Duration, it delivers one update per user per second on a
// steady schedule — the user's new position (a random walk at 1-2 m/s)
// and the RTTs nodes within 2 km measure to it (1 ms + 1 ms per 100 m,
// with noise) — and times, for each, the tier-1 and tier-2 decisions from
// its due time. A decision to migrate completes at once (no agents).
func RunController(ctx context.Context, cfg ControllerConfig) (ControllerReport, error) {
	if err := cfg.Validate(); err != nil {
		return ControllerReport{}, err
	}
	side := int(math.Ceil(math.Sqrt(float64(cfg.Nodes))))
	var t topo.Topology
	const spacing = 1000.0
	for r := 0; r < side; r++ {
		t.Regions = append(t.Regions, topo.Region{Name: fmt.Sprintf("r%d", r)})
		if r > 0 {
			t.Links = append(t.Links, topo.Link{A: fmt.Sprintf("r%d", r-1), B: fmt.Sprintf("r%d", r), DelayMs: 2, RateMbps: 1000})
		}
	}
	for i := 0; i < cfg.Nodes; i++ {
		row, col := i/side, i%side
		p := topo.Point{X: float64(col) * spacing, Y: float64(row) * spacing}
		region := fmt.Sprintf("r%d", row)
		t.Nodes = append(t.Nodes, topo.Node{Name: fmt.Sprintf("n%d", i), Region: region, Pos: p})
		for k, dx := range []float64{-250, 250} {
			t.APs = append(t.APs, topo.AP{Name: fmt.Sprintf("a%d-%d", i, k), Region: region, Pos: topo.Point{X: p.X + dx, Y: p.Y}})
		}
	}
	eng, err := controller.NewEngine(t, radio.DefaultModel(), time.Hour)
	if err != nil {
		return ControllerReport{}, err
	}
	idx := topo.NewIndex(t)
	now := time.Now()
	for _, n := range t.Nodes {
		nb := map[string]float64{}
		for _, m := range idx.NodesNear(nil, n.Pos, 2*spacing) {
			nb[m.Name] = 2 + topo.Dist(n.Pos, m.Pos)/100
		}
		if err := eng.Heartbeat(n.Name, "", 1e9, nil, now); err != nil {
			return ControllerReport{}, err
		}
		if err := eng.Measurements(n.Name, nb, nil); err != nil {
			return ControllerReport{}, err
		}
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 77))
	width := float64(side-1) * spacing
	type sim struct {
		name   string
		pos    topo.Point
		dx, dy float64
		rtts   map[string]float64
	}
	users := make([]sim, cfg.Users)
	kinds := policy.Kinds()
	for i := range users {
		p := topo.Point{X: rng.Float64() * width, Y: rng.Float64() * float64((cfg.Nodes-1)/side) * spacing}
		a := rng.Float64() * 2 * math.Pi
		v := 1 + rng.Float64()
		users[i] = sim{name: fmt.Sprintf("u%d", i), pos: p, dx: v * math.Cos(a), dy: v * math.Sin(a)}
		eng.AddUser(controller.UserState{Name: users[i].name, Pos: p})
		if d, err := eng.Move(users[i].name, p, now); err == nil && d.Handoff {
			_ = eng.Attach(users[i].name, d.To)
		}
		node, bd := t.Nodes[0].Name, math.Inf(1)
		for _, n := range idx.NodesNear(nil, p, 2*spacing) {
			if d := topo.Dist(n.Pos, p); d < bd {
				node, bd = n.Name, d
			}
		}
		users[i].rtts = map[string]float64{}
		// Thresholds for nodes 1 km apart: up to about 8 ms to the
		// nearest node.
		pc := policy.Config{Kind: kinds[i%len(kinds)], MinOps: 1000, ThresholdMs: 9}
		if err := eng.AddService(controller.ServiceState{Name: "s" + users[i].name, User: users[i].name, Node: node,
			MemoryBytes: 64 << 20, Policy: pc.WithDefaults()}); err != nil {
			return ControllerReport{}, err
		}
	}
	rep := ControllerReport{Nodes: cfg.Nodes, Users: cfg.Users, Cores: cfg.Cores, OfferedPS: float64(cfg.Users), ByPolicy: map[string]int64{},
		Goal: "p99 decision latency ≤ 10 ms on one core for 1,000 nodes and 100,000 users at one update per user per second"}
	var near []topo.Node
	var migrated [][2]string
	// One update: walk, measure, decide.
	update := func(u *sim, at time.Time) {
		u.pos.X = math.Min(math.Max(u.pos.X+u.dx, 0), width)
		u.pos.Y += u.dy
		d, err := eng.Move(u.name, u.pos, at)
		if err == nil && d.Handoff {
			_ = eng.Attach(u.name, d.To)
			rep.Handoffs++
		}
		clear(u.rtts)
		near = idx.NodesNear(near[:0], u.pos, 1.5*spacing)
		for _, n := range near {
			u.rtts[n.Name] = 1 + topo.Dist(n.Pos, u.pos)/100 + rng.Float64()*0.2
		}
		_ = eng.UserRTTs(u.name, u.rtts)
		_ = eng.Report(u.name, 800+rng.Float64()*400, 0, at)
		migrated = migrated[:0]
		eng.DecideEach(u.name, at, func(dec policy.Decision) {
			if dec.Migrate {
				rep.Migrations++
				rep.ByPolicy[dec.Policy]++
				migrated = append(migrated, [2]string{dec.Service, dec.To})
			}
		})
		for _, m := range migrated {
			eng.Migrated(m[0], m[1], true, at)
		}
	}
	prev := runtime.GOMAXPROCS(cfg.Cores)
	defer runtime.GOMAXPROCS(prev)
	defer debug.SetGCPercent(debug.SetGCPercent(controller.GCPercent)) // as `edgehop controller` runs
	// Warm-up: a tenth of the users once, untimed.
	for i := 0; i < cfg.Users/10; i++ {
		update(&users[i], time.Now())
	}
	runtime.GC()
	interval := time.Second / time.Duration(cfg.Users)
	if interval <= 0 {
		interval = time.Nanosecond
	}
	total := int(cfg.Duration / interval)
	if cfg.Duration%interval != 0 || total == 0 {
		total = int(float64(cfg.Users) * cfg.Duration.Seconds())
	}
	lat := make([]float64, 0, total)
	start := time.Now()
	next := 0
	for next < total {
		if ctx.Err() != nil {
			break
		}
		now := time.Now()
		due := int(float64(now.Sub(start)) / float64(time.Second) * float64(cfg.Users))
		if due > total {
			due = total
		}
		if due <= next {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		for ; next < due; next++ {
			dueAt := start.Add(time.Duration(float64(next) / float64(cfg.Users) * float64(time.Second)))
			update(&users[next%cfg.Users], dueAt)
			lat = append(lat, float64(time.Since(dueAt).Nanoseconds())/1e6)
		}
	}
	el := time.Since(start)
	rep.DurationS = el.Seconds()
	rep.Updates = int64(len(lat))
	rep.UpdatesPS = float64(len(lat)) / el.Seconds()
	rep.DecisionMs = Summarize(lat)
	rep.GoalMet = cfg.Nodes >= 1000 && cfg.Users >= 100_000 && cfg.Cores == 1 && rep.DecisionMs.P99 <= 10 && rep.UpdatesPS >= 0.99*rep.OfferedPS
	return rep, ctx.Err()
}

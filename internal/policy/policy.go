package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/model"
	"github.com/edgehop/edgehop/internal/topo"
)

// Kinds of policy.
const (
	KindLatency    = "latency"    // ARNAB Sec. 4.3 latency monitoring; Foglets
	KindRegion     = "region"     // ARNAB Sec. 4.3 regional access change with a hop limit
	KindTeka       = "teka"       // Teka et al. neighbour database and Algorithm 2
	KindThroughput = "throughput" // H-Container Sec. 7: migrate when throughput falls under a threshold
	KindModel      = "model"      // the performance model picks the target and the strategy
)

// Kinds lists the policies.
func Kinds() []string { return []string{KindLatency, KindRegion, KindTeka, KindThroughput, KindModel} }

// Config chooses and parameterises a service's policy. Zero fields take
// DefaultConfig's values.
type Config struct {
	Kind string `json:"kind"`
	// Latency: migrate when the user's latency to the serving node
	// exceeds ThresholdMs.
	ThresholdMs float64 `json:"threshold_ms,omitempty"`
	// Region: migrate when the user's region is MaxHops or more
	// aggregation links from the serving node's.
	MaxHops int `json:"max_hops,omitempty"`
	// Teka: nodes whose RTT to the serving node is at most NeighbourMs
	// (150 ms in the paper) form its neighbour database; the service's
	// initiation time (starting afresh) is weighed against the
	// migration's.
	NeighbourMs   float64 `json:"neighbour_ms,omitempty"`
	UselessMs     float64 `json:"useless_ms,omitempty"` // 1 s in the paper: beyond it the service is useless
	ServiceInitMs float64 `json:"service_init_ms,omitempty"`
	// Throughput: migrate when the user's throughput falls under MinOps
	// operations per second.
	MinOps float64 `json:"min_ops,omitempty"`
	// Model: the downtime the chosen strategy must meet.
	DowntimeTargetMs float64 `json:"downtime_target_ms,omitempty"`

	// Damping, for every policy: no migration within MinDwell of the
	// last; a target must be better than the serving node by
	// HysteresisMs of latency.
	MinDwell     time.Duration `json:"min_dwell_ns,omitempty"`
	HysteresisMs float64       `json:"hysteresis_ms,omitempty"`
	// ReturnSustain guards against ping-pong: a migration back to the
	// node the service last left waits until the policy has wanted it
	// continuously for this long (a user walking back for good passes;
	// one wandering on a border does not).
	ReturnSustain time.Duration `json:"return_sustain_ns,omitempty"`
	// ReuniteAfter: a group split across two nodes (a member moved
	// alone) for this long is made whole (Reunite); until then an
	// operator moving its members one by one is left to finish.
	ReuniteAfter time.Duration `json:"reunite_after_ns,omitempty"`
	// Strategy is the migration strategy (the model policy chooses its
	// own).
	Strategy string `json:"strategy,omitempty"`
}

// DefaultConfig returns the defaults of kind.
func DefaultConfig(kind string) Config {
	return Config{Kind: kind, ThresholdMs: 6, MaxHops: 1, NeighbourMs: 150, UselessMs: 1000, ServiceInitMs: 5000,
		MinOps: 0, DowntimeTargetMs: 1000, MinDwell: 10 * time.Second, HysteresisMs: 1, ReturnSustain: 30 * time.Second, ReuniteAfter: 30 * time.Second,
		Strategy: "stop-and-copy"}
}

// WithDefaults fills zero fields from DefaultConfig(c.Kind).
func (c Config) WithDefaults() Config {
	d := DefaultConfig(c.Kind)
	if c.ThresholdMs == 0 {
		c.ThresholdMs = d.ThresholdMs
	}
	if c.MaxHops == 0 {
		c.MaxHops = d.MaxHops
	}
	if c.NeighbourMs == 0 {
		c.NeighbourMs = d.NeighbourMs
	}
	if c.UselessMs == 0 {
		c.UselessMs = d.UselessMs
	}
	if c.ServiceInitMs == 0 {
		c.ServiceInitMs = d.ServiceInitMs
	}
	if c.DowntimeTargetMs == 0 {
		c.DowntimeTargetMs = d.DowntimeTargetMs
	}
	if c.MinDwell == 0 {
		c.MinDwell = d.MinDwell
	}
	if c.HysteresisMs == 0 {
		c.HysteresisMs = d.HysteresisMs
	}
	if c.ReturnSustain == 0 {
		c.ReturnSustain = d.ReturnSustain
	}
	if c.ReuniteAfter == 0 {
		c.ReuniteAfter = d.ReuniteAfter
	}
	if c.Strategy == "" {
		c.Strategy = d.Strategy
	}
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	known := false
	for _, k := range Kinds() {
		known = known || k == c.Kind
	}
	if !known {
		errs = append(errs, fmt.Errorf("policy %q: want one of %v", c.Kind, Kinds()))
	}
	for name, v := range map[string]float64{"threshold_ms": c.ThresholdMs, "neighbour_ms": c.NeighbourMs, "useless_ms": c.UselessMs,
		"service_init_ms": c.ServiceInitMs, "min_ops": c.MinOps, "downtime_target_ms": c.DowntimeTargetMs, "hysteresis_ms": c.HysteresisMs} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s %v: want a finite value ≥ 0", name, v))
		}
	}
	if c.MaxHops < 0 || c.MinDwell < 0 || c.ReturnSustain < 0 || c.ReuniteAfter < 0 {
		errs = append(errs, errors.New("max_hops, min_dwell, return_sustain and reunite_after must be ≥ 0"))
	}
	if c.Kind == KindThroughput && c.MinOps <= 0 {
		errs = append(errs, errors.New("throughput policy: min_ops must be > 0"))
	}
	return errors.Join(errs...)
}

// User is what the controller knows of one user a service serves.
type User struct {
	Name   string     `json:"name"`
	Pos    topo.Point `json:"pos"`
	AP     string     `json:"ap"`
	Region string     `json:"region"`
	// RTTMs is the measured round-trip time from each node to the user's
	// device (agents measure it through the emulated network); a node
	// without a measurement is not a candidate for latency-based
	// policies.
	RTTMs map[string]float64 `json:"rtt_ms"`
	// ThroughputOps is the device's reported operations per second (0:
	// not reported).
	ThroughputOps float64 `json:"throughput_ops"`
	// LatencyMs is the device's reported request latency (0: not
	// reported); RTTMs to the serving node stands in when it is absent.
	LatencyMs float64 `json:"latency_ms"`
}

// Node is what the controller knows of a node.
type Node struct {
	Name   string     `json:"name"`
	Region string     `json:"region"`
	Pos    topo.Point `json:"pos"`
	Alive  bool       `json:"alive"` // heartbeating
	// NeighbourRTTMs is the node's measured RTT to other nodes (Teka's
	// possible neighbour database, refreshed by its agent).
	NeighbourRTTMs map[string]float64 `json:"neighbour_rtt_ms,omitempty"`
	// LinkBps is the bit rate of its link (0: unknown).
	LinkBps float64 `json:"link_bps,omitempty"`
}

// Service is one service under a policy.
type Service struct {
	Name          string    `json:"name"`
	Node          string    `json:"node"`
	MemoryBytes   int64     `json:"memory_bytes"`
	DirtyRate     float64   `json:"dirty_rate"` // pages/s, for the model
	LastMigration time.Time `json:"last_migration"`
	// Left is the node the service last migrated away from ("" before
	// its first migration), and ReturnWanted since when the policy has
	// wanted, decision after decision, to go back to it (zero: it did
	// not want to at the last decision).
	Left         string    `json:"left,omitempty"`
	ReturnWanted time.Time `json:"return_wanted,omitempty"`
	Config       Config    `json:"policy"`
}

// View is everything a decision reads.
type View struct {
	Now     time.Time
	Topo    *topo.Index
	Service Service
	User    User // the user the service follows
	// Nodes looks a node up by name (false: unknown).
	Nodes func(name string) (Node, bool)
	// Params returns the performance model's parameters for a strategy
	// (fitted on this machine, or PAM's); nil uses model.DefaultParams.
	Params func(strategy model.Strategy) model.Params
}

// Decision is a policy's verdict, logged with its inputs.
type Decision struct {
	Service  string `json:"service"`
	User     string `json:"user"`
	Policy   string `json:"policy"`
	Migrate  bool   `json:"migrate"`
	From     string `json:"from"`
	To       string `json:"to,omitempty"`
	Strategy string `json:"strategy,omitempty"`
	Reason   string `json:"reason"`
	// Return: the policy wants the service back on the node it last
	// left (whether or not the ping-pong guard let it go yet); the
	// controller keeps Service.ReturnWanted from it.
	Return bool   `json:"return,omitempty"`
	Inputs Inputs `json:"inputs"`
}

// Inputs are the measurements and limits a decision read (zero: not
// used by the policy, except hops).
type Inputs struct {
	RTTServingMs         float64 `json:"rtt_serving_ms,omitempty"`
	RTTTargetMs          float64 `json:"rtt_target_ms,omitempty"`
	LatencyMs            float64 `json:"latency_ms,omitempty"`
	ThresholdMs          float64 `json:"threshold_ms,omitempty"`
	Hops                 float64 `json:"hops"`
	MaxHops              float64 `json:"max_hops,omitempty"`
	NeighbourRTTMs       float64 `json:"neighbour_rtt_ms,omitempty"`
	NeighbourLimitMs     float64 `json:"neighbour_limit_ms,omitempty"`
	InitialRTTMs         float64 `json:"initial_rtt_ms,omitempty"`
	DeltaRTTMs           float64 `json:"delta_rtt_ms,omitempty"`
	EstimatedMigrationMs float64 `json:"estimated_migration_ms,omitempty"`
	ServiceInitMs        float64 `json:"service_init_ms,omitempty"`
	MinOps               float64 `json:"min_ops,omitempty"`
	ThroughputOps        float64 `json:"throughput_ops,omitempty"`
	DowntimeTargetMs     float64 `json:"downtime_target_ms,omitempty"`
	BandwidthBps         float64 `json:"bandwidth_bps,omitempty"`
	StateBytes           float64 `json:"state_bytes,omitempty"` // what the model predicts moving
	PredictedDowntimeMs  float64 `json:"predicted_downtime_ms,omitempty"`
	PredictedTotalMs     float64 `json:"predicted_total_ms,omitempty"`
	SinceLastMigrationS  float64 `json:"since_last_migration_s,omitempty"`
}

// Decide runs the service's policy on v, damped: never towards a node
// that stopped heartbeating, not within the minimum dwell time of the
// last migration, and only to a target better than the serving node by
// the hysteresis margin.
func Decide(v View) Decision {
	c := v.Service.Config.WithDefaults()
	d := Decision{Service: v.Service.Name, User: v.User.Name, Policy: c.Kind, From: v.Service.Node}
	cur, curOK := v.User.RTTMs[v.Service.Node]
	if curOK {
		d.Inputs.RTTServingMs = cur
	}
	if !v.Service.LastMigration.IsZero() {
		since := v.Now.Sub(v.Service.LastMigration)
		d.Inputs.SinceLastMigrationS = since.Seconds()
		if since < c.MinDwell {
			d.Reason = fmt.Sprintf("dwell: migrated %.1f s ago, the minimum is %s", since.Seconds(), c.MinDwell)
			return d
		}
	}
	switch c.Kind {
	case KindLatency:
		d = latency(v, c, d)
	case KindRegion:
		d = region(v, c, d)
	case KindTeka:
		d = teka(v, c, d)
	case KindThroughput:
		d = throughput(v, c, d)
	case KindModel:
		d = modelDriven(v, c, d)
	default:
		d.Reason = fmt.Sprintf("unknown policy %q", c.Kind)
		return d
	}
	return guardReturn(v, c, d)
}

// Reunite decides for a group that runs split across the live nodes
// split (each holding some of its members) since since: once it has run
// so for Config.ReuniteAfter, the members on one node move to the other,
// the one nearer the user (the lower measured RTT; without measurements,
// the node the service was placed on). A group split across more than
// two nodes is left to the operator (it takes more than one move).
func Reunite(v View, split []string, since time.Time) Decision {
	c := v.Service.Config.WithDefaults()
	d := Decision{Service: v.Service.Name, User: v.User.Name, Policy: c.Kind, From: v.Service.Node}
	if len(split) != 2 {
		d.Reason = fmt.Sprintf("split across %d nodes (%s): made whole only from two; move its members together by hand", len(split), strings.Join(split, ", "))
		return d
	}
	waited := v.Now.Sub(since)
	if waited < c.ReuniteAfter {
		d.Reason = fmt.Sprintf("split across %s and %s for %.1f s: made whole once split for %s", split[0], split[1], waited.Seconds(), c.ReuniteAfter)
		return d
	}
	to := split[0]
	r0, ok0 := v.User.RTTMs[split[0]]
	r1, ok1 := v.User.RTTMs[split[1]]
	switch {
	case ok0 && ok1 && r1 < r0, ok1 && !ok0:
		to = split[1]
	case ok0 || ok1:
	case v.Service.Node == split[1]:
		to = split[1]
	}
	from := split[0]
	if to == split[0] {
		from = split[1]
	}
	d.Migrate, d.From, d.To, d.Strategy = true, from, to, c.Strategy
	why := "nearer the user"
	if r, ok := v.User.RTTMs[to]; ok {
		d.Inputs.RTTTargetMs = r
		why = fmt.Sprintf("nearer the user (%.2f ms)", r)
	} else {
		why = "where it was placed (no RTT to the user measured)"
	}
	d.Reason = fmt.Sprintf("reunite: split across %s and %s for %.1f s (at least %s); its members on %s join those on %s, %s",
		split[0], split[1], waited.Seconds(), c.ReuniteAfter, from, to, why)
	return d
}

// guardReturn holds a migration back to the node the service last left
// until the policy has wanted it for ReturnSustain without a break: the
// dwell time and the hysteresis margin alone let a user who walks back
// and forth across a border drag the service along at every crossing.
func guardReturn(v View, c Config, d Decision) Decision {
	if !d.Migrate || v.Service.Left == "" || d.To != v.Service.Left {
		return d
	}
	d.Return = true
	wanted := time.Duration(0)
	if !v.Service.ReturnWanted.IsZero() {
		wanted = v.Now.Sub(v.Service.ReturnWanted)
	}
	if wanted >= c.ReturnSustain {
		d.Reason += fmt.Sprintf("; wanted back on %s for %.1f s (at least %s)", d.To, wanted.Seconds(), c.ReturnSustain)
		return d
	}
	d.Migrate = false
	d.Reason = fmt.Sprintf("ping-pong guard: %s is the node the service left; back only once wanted for %s (%.1f s so far): %s",
		d.To, c.ReturnSustain, wanted.Seconds(), d.Reason)
	return d
}

// best is the alive node with the lowest measured RTT to the user, other
// than exclude ("" when none); ties by name.
func best(v View, exclude string) (string, float64) {
	bn, br := "", math.Inf(1)
	for n, r := range v.User.RTTMs {
		if n == exclude || !v.node(n).Alive {
			continue
		}
		if r < br || (r == br && n < bn) {
			bn, br = n, r
		}
	}
	return bn, br
}

// node looks n up; an unknown node is a dead one.
func (v View) node(n string) Node {
	if v.Nodes == nil {
		return Node{}
	}
	nd, _ := v.Nodes(n)
	return nd
}

// towardsBest completes d with a migration to the lowest-RTT alive node,
// provided it beats the serving node by the hysteresis margin.
func towardsBest(v View, c Config, d Decision, why string) Decision {
	to, rtt := best(v, v.Service.Node)
	if to == "" {
		d.Reason = why + "; no other live node has a measured RTT to the user"
		return d
	}
	d.Inputs.RTTTargetMs = rtt
	cur, ok := v.User.RTTMs[v.Service.Node]
	if !ok && v.node(v.Service.Node).Alive {
		d.Reason = fmt.Sprintf("%s; but %s, serving, has not measured the user yet: no comparison", why, v.Service.Node)
		return d
	}
	if ok && v.node(v.Service.Node).Alive && rtt > cur-c.HysteresisMs {
		d.Reason = fmt.Sprintf("%s; but %s (%.2f ms) is not %.2f ms better than %s (%.2f ms)", why, to, rtt, c.HysteresisMs, v.Service.Node, cur)
		return d
	}
	d.Migrate, d.To, d.Strategy = true, to, c.Strategy
	d.Reason = fmt.Sprintf("%s; %s is closest (%.2f ms)", why, to, rtt)
	return d
}

// userLatency is the latency to the user: the serving node's measured RTT
// (Foglets: "continuously monitored through ping messages"), else the
// device's own report. Comparing it with the other nodes' RTTs compares
// like with like; a device's request latency adds the service's own time.
func userLatency(v View) (float64, bool) {
	if r, ok := v.User.RTTMs[v.Service.Node]; ok {
		return r, true
	}
	if v.User.LatencyMs > 0 {
		return v.User.LatencyMs, true
	}
	return 0, false
}

// latency: ARNAB Sec. 4.3, "the latency can be measured between the user
// device and the serving edge"; Foglets: "the application component is
// migrated to a suitable node when the latency exceeds a threshold".
func latency(v View, c Config, d Decision) Decision {
	l, ok := userLatency(v)
	d.Inputs.ThresholdMs = c.ThresholdMs
	if !ok {
		d.Reason = "no latency measured for the user yet"
		return d
	}
	d.Inputs.LatencyMs = l
	if l <= c.ThresholdMs && v.node(v.Service.Node).Alive {
		d.Reason = fmt.Sprintf("latency %.2f ms within the threshold %.2f ms", l, c.ThresholdMs)
		return d
	}
	return towardsBest(v, c, d, fmt.Sprintf("latency %.2f ms above the threshold %.2f ms", l, c.ThresholdMs))
}

// region: ARNAB Sec. 4.3, "the migration can be triggered if the number
// of hops has reached a predefined value for the respective application".
func region(v View, c Config, d Decision) Decision {
	srv := v.node(v.Service.Node)
	hops := v.Topo.RegionHops(v.User.Region, srv.Region)
	d.Inputs.Hops = float64(hops)
	d.Inputs.MaxHops = float64(c.MaxHops)
	if hops >= 0 && hops < c.MaxHops && srv.Alive {
		d.Reason = fmt.Sprintf("user in %s, %d hop(s) from %s's %s: under the limit %d", v.User.Region, hops, srv.Name, srv.Region, c.MaxHops)
		return d
	}
	// The target: a live node of the user's region, the one the user
	// measures closest (else the nearest by position).
	var cands []string
	bd := math.Inf(1)
	for _, n := range v.Topo.RegionNodes(v.User.Region) {
		if !v.node(n.Name).Alive || n.Name == srv.Name {
			continue
		}
		// The nearest by position first.
		if d := topo.Dist(n.Pos, v.User.Pos); d < bd {
			bd = d
			cands = append([]string{n.Name}, cands...)
		} else {
			cands = append(cands, n.Name)
		}
	}
	if len(cands) == 0 {
		d.Reason = fmt.Sprintf("user in %s, %d hop(s) away, but no live node in that region", v.User.Region, hops)
		return d
	}
	to := cands[0]
	for _, n := range cands {
		if r, ok := v.User.RTTMs[n]; ok {
			if rb, okb := v.User.RTTMs[to]; !okb || r < rb {
				to = n
			}
		}
	}
	rTo, okTo := v.User.RTTMs[to]
	rCur, okCur := v.User.RTTMs[srv.Name]
	if okTo && okCur && srv.Alive && rTo > rCur-c.HysteresisMs {
		// Just across a border: the user is in the new region, but not
		// measurably closer to its node yet.
		d.Reason = fmt.Sprintf("user in %s, %d hop(s) away, but %s (%.2f ms) is not %.2f ms better than %s (%.2f ms)",
			v.User.Region, hops, to, rTo, c.HysteresisMs, srv.Name, rCur)
		return d
	}
	d.Migrate, d.To, d.Strategy = true, to, c.Strategy
	d.Reason = fmt.Sprintf("user's access moved to %s, %d hop(s) from %s (limit %d): %s serves %s", v.User.Region, hops, srv.Region, c.MaxHops, to, v.User.Region)
	return d
}

// teka: Teka et al. Sec. V, Algorithm 2. The candidate is the node the
// user now reaches best ("when a cloudlet receives a packet from a remote
// LAN, it checks whether the network address matches any of the cloudlets
// in the possible neighbour database"; only neighbours under 150 ms RTT
// qualify). Then: "if (initial RTT + Delta RTT <= 150msec) then migrate
// the VM else if ((150msec < Initial RTT + delta RTT <= 1sec) and
// (estimated VM migration time < service initiation time)) then migrate
// the VM else ignore VM migration".
func teka(v View, c Config, d Decision) Decision {
	to, rttTo := best(v, "")
	if to == "" {
		d.Reason = "no live node has a measured RTT to the user"
		return d
	}
	if to == v.Service.Node {
		d.Reason = fmt.Sprintf("the user reaches %s best (%.2f ms): nothing to do", to, rttTo)
		return d
	}
	cur, okCur := v.User.RTTMs[v.Service.Node]
	if !okCur && v.node(v.Service.Node).Alive {
		d.Reason = fmt.Sprintf("%s, serving, has not measured the user yet: no comparison", v.Service.Node)
		return d
	}
	if okCur && rttTo > cur-c.HysteresisMs && v.node(v.Service.Node).Alive {
		d.Reason = fmt.Sprintf("%s (%.2f ms) is not %.2f ms better than %s (%.2f ms)", to, rttTo, c.HysteresisMs, v.Service.Node, cur)
		return d
	}
	nb, inDB := v.node(v.Service.Node).NeighbourRTTMs[to]
	d.Inputs.NeighbourRTTMs = nb
	d.Inputs.NeighbourLimitMs = c.NeighbourMs
	if !inDB || nb > c.NeighbourMs {
		d.Reason = fmt.Sprintf("%s is not in %s's possible neighbour database (RTT %.1f ms, limit %.0f ms, measured %t)", to, v.Service.Node, nb, c.NeighbourMs, inDB)
		return d
	}
	// Initial RTT: what the user sees of the service now, over the path
	// through the WAN; Delta RTT: the increase while the state crosses
	// the link (profiled: the state's transfer time over the neighbour
	// path stands for the queueing it adds, bounded by that path's RTT).
	initial := cur
	if !okCur {
		initial = rttTo + nb
	}
	est := estimateMigrationMs(v, c.Strategy, nb)
	delta := math.Min(est, nb)
	d.Inputs.InitialRTTMs, d.Inputs.DeltaRTTMs, d.Inputs.EstimatedMigrationMs, d.Inputs.ServiceInitMs = initial, delta, est, c.ServiceInitMs
	switch sum := initial + delta; {
	case sum <= c.NeighbourMs:
		d.Migrate, d.To, d.Strategy = true, to, c.Strategy
		d.Reason = fmt.Sprintf("Alg. 2: initial RTT + ΔRTT = %.1f ms ≤ %.0f ms: migrate to %s", sum, c.NeighbourMs, to)
	case sum <= c.UselessMs && est < c.ServiceInitMs:
		d.Migrate, d.To, d.Strategy = true, to, c.Strategy
		d.Reason = fmt.Sprintf("Alg. 2: %.1f ms ≤ %.0f ms and migration %.0f ms < initiation %.0f ms: migrate to %s", sum, c.UselessMs, est, c.ServiceInitMs, to)
	default:
		d.Reason = fmt.Sprintf("Alg. 2: initial RTT + ΔRTT = %.1f ms and migration %.0f ms vs initiation %.0f ms: ignore the migration, start afresh", sum, est, c.ServiceInitMs)
	}
	return d
}

// throughput: H-Container Sec. 7, migration "when the throughput (Redis)
// ... fall[s] under a certain threshold".
func throughput(v View, c Config, d Decision) Decision {
	d.Inputs.MinOps = c.MinOps
	if v.User.ThroughputOps <= 0 {
		d.Reason = "no throughput reported by the user yet"
		return d
	}
	d.Inputs.ThroughputOps = v.User.ThroughputOps
	if v.User.ThroughputOps >= c.MinOps && v.node(v.Service.Node).Alive {
		d.Reason = fmt.Sprintf("throughput %.0f op/s at or above %.0f op/s", v.User.ThroughputOps, c.MinOps)
		return d
	}
	return towardsBest(v, c, d, fmt.Sprintf("throughput %.0f op/s under %.0f op/s", v.User.ThroughputOps, c.MinOps))
}

// modelDriven: the closest live node is the target when it beats the
// serving node by the margin; the performance model (fitted on this
// machine when parameters are given) picks the strategy that meets the
// service's downtime target, and no migration happens when none does.
func modelDriven(v View, c Config, d Decision) Decision {
	to, rtt := best(v, v.Service.Node)
	cur, ok := v.User.RTTMs[v.Service.Node]
	if to == "" || (ok && v.node(v.Service.Node).Alive && rtt > cur-c.HysteresisMs) {
		d.Reason = fmt.Sprintf("no live node closer than %s by %.2f ms", v.Service.Node, c.HysteresisMs)
		return d
	}
	d.Inputs.RTTTargetMs = rtt
	bw := v.node(to).LinkBps
	if s := v.node(v.Service.Node).LinkBps; s > 0 && (bw == 0 || s < bw) {
		bw = s
	}
	if bw == 0 {
		bw = 1e9
	}
	params := model.DefaultParams()
	var by map[model.Strategy]model.Params
	if v.Params != nil {
		by = map[model.Strategy]model.Params{}
		for _, s := range implemented {
			by[s] = v.Params(s)
		}
	}
	d.Inputs.StateBytes = float64(max(v.Service.MemoryBytes, 1<<20))
	res, err := model.Plan(params, model.Request{
		Inputs:        model.Inputs{StateBytes: d.Inputs.StateBytes, DirtyRate: v.Service.DirtyRate, BandwidthBps: bw, RTTMs: v.node(v.Service.Node).NeighbourRTTMs[to]},
		MaxDowntimeMs: c.DowntimeTargetMs, Strategies: implemented, ByStrategy: by,
	})
	d.Inputs.DowntimeTargetMs = c.DowntimeTargetMs
	d.Inputs.BandwidthBps = bw
	if err != nil || !res.Feasible {
		d.Reason = fmt.Sprintf("%s is closer (%.2f ms) but no strategy meets the downtime target %.0f ms (%v %v)", to, rtt, c.DowntimeTargetMs, err, res.Unmet)
		return d
	}
	d.Inputs.PredictedDowntimeMs = res.Choice.Prediction.DowntimeMs
	d.Inputs.PredictedTotalMs = res.Choice.Prediction.TotalMs
	d.Migrate, d.To, d.Strategy = true, to, string(res.Choice.Strategy)
	d.Reason = fmt.Sprintf("%s is closer (%.2f ms); the model picks %s: %.0f ms downtime predicted, target %.0f ms",
		to, rtt, res.Choice.Strategy, res.Choice.Prediction.DowntimeMs, c.DowntimeTargetMs)
	return d
}

var implemented = []model.Strategy{"stop-and-copy", "post-copy", "pre-copy", "hybrid"}

// estimateMigrationMs predicts a migration's total time with the model.
func estimateMigrationMs(v View, strategy string, rttMs float64) float64 {
	bw := v.node(v.Service.Node).LinkBps
	if bw == 0 {
		bw = 1e9
	}
	p := model.DefaultParams()
	if v.Params != nil {
		p = v.Params(model.Strategy(strategy))
	}
	pr, err := p.Predict(model.Strategy(strategy), model.Inputs{StateBytes: float64(max(v.Service.MemoryBytes, 1<<20)),
		DirtyRate: v.Service.DirtyRate, BandwidthBps: bw, RTTMs: rttMs, Iterations: 1})
	if err != nil {
		return math.Inf(1)
	}
	return pr.TotalMs
}

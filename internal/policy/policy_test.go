package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/topo"
)

var t0 = time.Unix(1_700_000_000, 0)

// world is the demo's line: 3 regions of 300 m, a node in each.
func world() *topo.Index { return topo.NewIndex(topo.Line(3, 2, 300)) }

func nodes(alive ...bool) map[string]Node {
	tp := world()
	out := map[string]Node{}
	for i, n := range tp.T.Nodes {
		out[n.Name] = Node{Name: n.Name, Region: n.Region, Pos: n.Pos, Alive: i >= len(alive) || alive[i], LinkBps: 1e9,
			NeighbourRTTMs: map[string]float64{"node0": 4, "node1": 4, "node2": 8}}
	}
	return out
}

func lookup(m map[string]Node) func(string) (Node, bool) {
	return func(n string) (Node, bool) { nd, ok := m[n]; return nd, ok }
}

// view puts the user at x with RTTs that grow 1 ms per 100 m from each
// node (H-Container's emulation), the service on node0.
func view(kind string, x float64) View {
	tp := world()
	u := User{Name: "alice", Pos: topo.Point{X: x}, RTTMs: map[string]float64{}}
	u.AP = tp.T.NearestAP(u.Pos)
	a, _ := tp.AP(u.AP)
	u.Region = a.Region
	for _, n := range tp.T.Nodes {
		u.RTTMs[n.Name] = 1 + topo.Dist(n.Pos, u.Pos)/100
	}
	return View{Now: t0, Topo: tp, User: u, Nodes: lookup(nodes()),
		Service: Service{Name: "redis", Node: "node0", MemoryBytes: 20 << 20, Config: Config{Kind: kind}}}
}

func TestLatencyPolicy(t *testing.T) {
	v := view(KindLatency, 100)
	if d := Decide(v); d.Migrate {
		t.Fatalf("near node0: %+v", d)
	}
	v = view(KindLatency, 600)
	v.Service.Config.ThresholdMs = 4
	d := Decide(v)
	if !d.Migrate || d.To != "node1" || d.Strategy == "" || d.Inputs.LatencyMs == 0 {
		t.Fatalf("far from node0, near node1: %+v", d)
	}
	if !strings.Contains(d.Reason, "above the threshold") {
		t.Errorf("reason %q", d.Reason)
	}
}

func TestRegionPolicy(t *testing.T) {
	v := view(KindRegion, 250) // region0
	if d := Decide(v); d.Migrate {
		t.Fatalf("same region: %+v", d)
	}
	v = view(KindRegion, 400) // region1, 1 hop
	d := Decide(v)
	if !d.Migrate || d.To != "node1" || d.Inputs.Hops != 1 {
		t.Fatalf("one hop with a limit of 1: %+v", d)
	}
	v.Service.Config.MaxHops = 2 // a tolerant application
	if d := Decide(v); d.Migrate {
		t.Fatalf("one hop with a limit of 2: %+v", d)
	}
}

// Teka et al. Algorithm 2, both branches and the refusal.
func TestTekaPolicy(t *testing.T) {
	v := view(KindTeka, 450)
	d := Decide(v)
	if !d.Migrate || d.To != "node1" || !strings.Contains(d.Reason, "≤ 150 ms") {
		t.Fatalf("a near neighbour: %+v", d)
	}
	// Not in the possible neighbour database (RTT over 150 ms).
	ns := nodes()
	ns["node0"] = Node{Name: "node0", Region: "region0", Alive: true, NeighbourRTTMs: map[string]float64{"node1": 180}}
	v.Nodes = lookup(ns)
	if d := Decide(v); d.Migrate || !strings.Contains(d.Reason, "neighbour database") {
		t.Fatalf("beyond 150 ms: %+v", d)
	}
	// 150 ms < RTT + ΔRTT ≤ 1 s: only when migrating beats starting afresh.
	v = view(KindTeka, 450)
	v.User.RTTMs["node0"] = 400
	v.Service.Config.ServiceInitMs = 1e9
	if d := Decide(v); !d.Migrate || !strings.Contains(d.Reason, "< initiation") {
		t.Fatalf("slow but worth it: %+v", d)
	}
	v.Service.Config.ServiceInitMs = 1 // starting afresh is instant
	if d := Decide(v); d.Migrate || !strings.Contains(d.Reason, "ignore") {
		t.Fatalf("not worth it: %+v", d)
	}
}

func TestThroughputPolicy(t *testing.T) {
	v := view(KindThroughput, 600)
	v.Service.Config.MinOps = 1000
	v.User.ThroughputOps = 5000
	if d := Decide(v); d.Migrate {
		t.Fatalf("above the threshold: %+v", d)
	}
	v.User.ThroughputOps = 400
	if d := Decide(v); !d.Migrate || d.To != "node1" {
		t.Fatalf("under the threshold: %+v", d)
	}
	if err := (Config{Kind: KindThroughput}).Validate(); err == nil {
		t.Error("throughput policy without min_ops accepted")
	}
}

func TestModelPolicy(t *testing.T) {
	v := view(KindModel, 600)
	// PAM's Table III parameters (Podman) predict 0.86-1.26 s here: only
	// the lazy strategies meet one second.
	v.Service.Config.DowntimeTargetMs = 1000
	d := Decide(v)
	if !d.Migrate || d.To != "node1" || d.Strategy == "" || d.Inputs.PredictedDowntimeMs <= 0 {
		t.Fatalf("model: %+v", d)
	}
	if d.Inputs.PredictedDowntimeMs > 1000 || (d.Strategy != "post-copy" && d.Strategy != "hybrid") {
		t.Errorf("chose a strategy over the target: %+v", d)
	}
	v.Service.Config.DowntimeTargetMs = 0.001 // impossible
	if d := Decide(v); d.Migrate || !strings.Contains(d.Reason, "no strategy meets") {
		t.Fatalf("impossible target: %+v", d)
	}
}

// Damping: a dead node is never a target; nothing moves within the dwell
// time; a target must beat the serving node by the hysteresis margin.
func TestDamping(t *testing.T) {
	for _, kind := range Kinds() {
		v := view(kind, 600)
		v.Service.Config.MinOps = 1000
		v.User.ThroughputOps = 10
		ns := nodes()
		ns["node1"] = Node{Name: "node1", Region: "region1", Pos: topo.Point{X: 450, Y: 50}, Alive: false}
		v.Nodes = lookup(ns)
		if d := Decide(v); d.Migrate && d.To == "node1" {
			t.Errorf("%s: migrated to a node that stopped heartbeating: %+v", kind, d)
		}
		v = view(kind, 600)
		v.Service.Config.MinOps = 1000
		v.User.ThroughputOps = 10
		v.Service.LastMigration = t0.Add(-3 * time.Second)
		if d := Decide(v); d.Migrate || !strings.Contains(d.Reason, "dwell") {
			t.Errorf("%s: within the dwell time: %+v", kind, d)
		}
	}
	// A user on the border between node0 and node1 (x=300) with a
	// threshold below both: the candidate is not better by the margin.
	v := view(KindLatency, 300)
	v.Service.Config.ThresholdMs = 0.5
	if d := Decide(v); d.Migrate {
		t.Errorf("border: %+v", d)
	}
}

// A user walking back and forth across the border between two regions
// does not make its service oscillate: each policy migrates at most once
// per dwell time, and not at all while the gain is under the margin.
func TestBorderNoOscillation(t *testing.T) {
	for _, kind := range Kinds() {
		at := "node0"
		var last time.Time
		moves := 0
		for i := 0; i < 600; i++ { // 10 minutes, a step a second
			now := t0.Add(time.Duration(i) * time.Second)
			x := 300 + 12*float64((i%8)-4) // ±48 m around the border
			v := view(kind, x)
			v.Now = now
			v.Service.Node, v.Service.LastMigration = at, last
			v.Service.Config.MinOps = 1000
			v.User.ThroughputOps = 900
			if d := Decide(v); d.Migrate {
				at, last = d.To, now
				moves++
			}
		}
		if moves > 1 {
			t.Errorf("%s: %d migrations wandering on a border, want at most 1", kind, moves)
		}
	}
}

// Before the serving node has measured the user (a service just placed,
// a restarted agent), no policy compares it with the others: a decision
// on partial measurements would move the service away from the closest
// node.
func TestNoDecisionWithoutTheServingNodesMeasurement(t *testing.T) {
	for _, kind := range []string{KindLatency, KindTeka, KindThroughput} {
		v := view(kind, 100) // near node0, which serves
		delete(v.User.RTTMs, "node0")
		v.User.LatencyMs = 50 // the device's own report: above any threshold
		v.User.ThroughputOps = 1
		v.Service.Config.ThresholdMs = 4
		v.Service.Config.MinOps = 1000
		if d := Decide(v); d.Migrate {
			t.Errorf("%s: migrated to %s without node0's measurement: %s", kind, d.To, d.Reason)
		}
	}
}

func TestReunite(t *testing.T) {
	t0 := time.Unix(1000, 0)
	alive := func(n string) (Node, bool) { return Node{Name: n, Alive: true}, true }
	cases := []struct {
		name      string
		split     []string
		node      string
		rtt       map[string]float64
		waited    time.Duration
		from, to  string // "" to: no migration
		reasonHas string
	}{
		{"too soon", []string{"a", "b"}, "a", map[string]float64{"a": 3, "b": 1}, 29 * time.Second, "", "", "made whole once split for 30s"},
		{"nearer b", []string{"a", "b"}, "a", map[string]float64{"a": 3, "b": 1}, 30 * time.Second, "a", "b", "nearer the user (1.00 ms)"},
		{"nearer a", []string{"a", "b"}, "b", map[string]float64{"a": 1, "b": 3}, time.Minute, "b", "a", "nearer the user"},
		{"tie: first", []string{"a", "b"}, "b", map[string]float64{"a": 2, "b": 2}, time.Minute, "b", "a", "nearer"},
		{"only b measured", []string{"a", "b"}, "a", map[string]float64{"b": 7}, time.Minute, "a", "b", "nearer"},
		{"none measured: placed", []string{"a", "b"}, "b", nil, time.Minute, "a", "b", "where it was placed"},
		{"none measured, placed elsewhere", []string{"a", "b"}, "c", nil, time.Minute, "b", "a", "where it was placed"},
		{"three nodes", []string{"a", "b", "c"}, "a", map[string]float64{"a": 1}, time.Hour, "", "", "made whole only from two"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := View{Now: t0.Add(tc.waited), Nodes: alive,
				Service: Service{Name: "app", Node: tc.node, Config: Config{Kind: KindLatency}},
				User:    User{Name: "u", RTTMs: tc.rtt}}
			d := Reunite(v, tc.split, t0)
			if d.Migrate != (tc.to != "") || (tc.to != "" && (d.From != tc.from || d.To != tc.to || d.Strategy != "stop-and-copy")) {
				t.Fatalf("Reunite = %+v, want %s -> %s", d, tc.from, tc.to)
			}
			if !strings.Contains(d.Reason, tc.reasonHas) {
				t.Errorf("reason %q lacks %q", d.Reason, tc.reasonHas)
			}
		})
	}
}

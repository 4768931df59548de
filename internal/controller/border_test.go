package controller

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/topo"
)

// walkEngine drives an engine through a user's path, a position each
// half second, with the RTTs the testbed's agents measure (2 ms per
// 100 m round trip, plus up to 1 ms of noise from a loaded link) and
// every migration the policy decides done at once. It returns the
// nodes the service moved to.
func walkEngine(t *testing.T, kind string, path func(el time.Duration) topo.Point, d time.Duration) []string {
	t.Helper()
	tp := topo.Line(3, 2, 300)
	e, err := NewEngine(tp, radio.DefaultModel(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, n := range tp.Nodes {
		if err := e.Heartbeat(n.Name, "", 1e9, nil, t0); err != nil {
			t.Fatal(err)
		}
		if err := e.Measurements(n.Name, map[string]float64{"node0": 4, "node1": 4, "node2": 8}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.AddUser(UserState{Name: "alice", Pos: path(0)})
	cfg := policy.Config{Kind: kind, ThresholdMs: 5}
	if kind == policy.KindThroughput {
		cfg.MinOps = 1000
	}
	if err := e.AddService(ServiceState{Name: "redis", User: "alice", Node: "node0", Policy: cfg}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var moves []string
	for el := time.Duration(0); el <= d; el += 500 * time.Millisecond {
		now := t0.Add(el)
		p := path(el)
		for _, n := range tp.Nodes {
			if err := e.Heartbeat(n.Name, "", 1e9, nil, now); err != nil {
				t.Fatal(err)
			}
			rtt := 0.4 + 2*topo.Dist(n.Pos, p)/100 + rng.Float64()
			if err := e.Measurements(n.Name, nil, map[string]float64{"alice": rtt}); err != nil {
				t.Fatal(err)
			}
		}
		hd, err := e.Move("alice", p, now)
		if err != nil {
			t.Fatal(err)
		}
		if hd.Handoff {
			if err := e.Attach("alice", hd.To); err != nil {
				t.Fatal(err)
			}
		}
		// The user's device sees its throughput fall with the serving
		// node's RTT (one request in flight per connection).
		s, _ := e.Service("redis")
		u, _ := e.User("alice")
		if err := e.Report("alice", 4*1000/u.RTTMs[s.Node]*0.4, u.RTTMs[s.Node], now); err != nil {
			t.Fatal(err)
		}
		for _, d := range e.Decide("alice", now) {
			if d.Migrate {
				moves = append(moves, d.To)
				e.Migrated(d.Service, d.To, true, now)
			}
		}
	}
	return moves
}

// zigzag walks from x0 to the border at x=300, then back and forth
// ±swing around it at speed (m/s).
func zigzag(x0, swing, speed float64) func(time.Duration) topo.Point {
	return func(el time.Duration) topo.Point {
		m := el.Seconds() * speed
		first := 300 - swing - x0
		if m < first {
			return topo.Point{X: x0 + m}
		}
		m -= first
		leg := 2 * swing
		k := int(m / leg)
		f := m - float64(k)*leg
		if k%2 == 0 {
			return topo.Point{X: 300 - swing + f}
		}
		return topo.Point{X: 300 + swing - f}
	}
}

// A user walking back and forth across the border between two regions
// (the e2e border walk: ±48 m at 10 m/s for two minutes, then ±80 m) does
// not make its service oscillate under any policy: it moves across once
// at most. Without the ping-pong guard the latency, region and
// throughput policies flip it at crossing after crossing.
func TestBorderWalkDoesNotOscillate(t *testing.T) {
	for _, swing := range []float64{48, 80} {
		for _, kind := range policy.Kinds() {
			t.Run(fmt.Sprintf("%s/±%.0fm", kind, swing), func(t *testing.T) {
				moves := walkEngine(t, kind, zigzag(150, swing, 10), 2*time.Minute)
				if len(moves) > 1 {
					t.Errorf("service moved %v on a border walk, want at most once", moves)
				}
			})
		}
	}
}

// The guard does not keep a service away from a user who really goes
// back: walked to node1's region and back to node0's for good, the
// service follows there and back.
func TestServiceFollowsAUserWhoWalksBack(t *testing.T) {
	for _, kind := range []string{policy.KindLatency, policy.KindRegion, policy.KindTeka} {
		t.Run(kind, func(t *testing.T) {
			path := func(el time.Duration) topo.Point {
				s := el.Seconds()
				switch {
				case s < 30: // 150 -> 450 at 10 m/s
					return topo.Point{X: 150 + 10*s}
				case s < 60: // stays near node1
					return topo.Point{X: 450}
				case s < 90: // back to node0
					return topo.Point{X: 450 - 10*(s-60)}
				}
				return topo.Point{X: 150}
			}
			moves := walkEngine(t, kind, path, 3*time.Minute)
			if fmt.Sprint(moves) != "[node1 node0]" {
				t.Errorf("service moved %v, want node1 then back to node0", moves)
			}
		})
	}
}

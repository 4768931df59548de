package bench

import (
	"context"
	"testing"
	"time"
)

// A small run of the real decision loop: every update is decided, the
// report adds up, and users walking around a grid cause handoffs.
func TestRunControllerSmall(t *testing.T) {
	cfg := ControllerConfig{Nodes: 16, Users: 2000, Duration: time.Second, Cores: 1, Seed: 3}
	rep, err := RunController(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Updates < 1900 || rep.UpdatesPS < 1500 {
		t.Errorf("updates %d at %.0f/s, want about 2000/s", rep.Updates, rep.UpdatesPS)
	}
	if rep.DecisionMs.P50 <= 0 || rep.DecisionMs.P99 < rep.DecisionMs.P50 {
		t.Errorf("latency summary %+v", rep.DecisionMs)
	}
	if rep.GoalMet {
		t.Error("the goal is for 1,000 nodes and 100,000 users; a small run cannot meet it")
	}
	if (ControllerConfig{Nodes: 0, Users: 1, Duration: time.Second, Cores: 1}).Validate() == nil {
		t.Error("zero nodes accepted")
	}
}

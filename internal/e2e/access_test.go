package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testbed"
)

// TestAccessHandoff: a client's virtual AP moves between access point
// namespaces while it talks to a service over one TCP connection: its
// address and connection stay, every reply checks out, and the link is
// down only for the move.
func TestAccessHandoff(t *testing.T) {
	e := newEnv(t)
	spec := testbed.DefaultSpec(e.name, 1, 1)
	spec.APs = []testbed.Endpoint{{Name: "ap0", Link: testbed.DefaultAPLink}, {Name: "ap1", Link: testbed.DefaultAPLink}}
	st := e.upAPI(spec, testbed.Options{})
	if st.Clients[0].AP != "ap0" {
		t.Fatalf("client starts on %q, want ap0", st.Clients[0].AP)
	}
	var c ctr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "p", "--image", "probe", "--json")
	addr := c.IP + ":7000"
	probeExchange(t, st.Clients[0].NetNS, addr, 3)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lc, err := runLiveClient(ctx, &wg, st.Clients[0].NetNSPath, addr, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var worst time.Duration
	for i, to := range []string{"ap1", "ap0", "ap1", "ap0"} {
		before := lc.replies.Load()
		took, err := testbed.Handoff(context.Background(), e.root, e.name, "client0", to)
		if err != nil {
			t.Fatalf("handoff %d to %s: %v", i, to, err)
		}
		worst = max(worst, took)
		deadline := time.Now().Add(10 * time.Second)
		for lc.replies.Load() < before+20 {
			if time.Now().After(deadline) {
				t.Fatalf("no replies after the handoff to %s", to)
			}
			time.Sleep(10 * time.Millisecond)
		}
		now, _ := testbed.Load(e.root, e.name)
		if now.Clients[0].AP != to {
			t.Errorf("state says client0 on %s after a handoff to %s", now.Clients[0].AP, to)
		}
	}
	cancel()
	wg.Wait()
	if lc.err != nil {
		t.Fatalf("client across handoffs: %v", lc.err)
	}
	t.Logf("link down at most %v per handoff; the client's longest wait for a reply %v", worst, lc.maxGap)
	if _, err := testbed.Handoff(context.Background(), e.root, e.name, "client0", "ap9"); err == nil {
		t.Error("handoff to an unknown AP accepted")
	}
}

package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/probe"
)

// nsDialer opens connections from inside a network namespace.
type nsDialer struct{ ns string }

func (d nsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := linux.InNetNS(d.ns, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

type migResult struct {
	OK          bool               `json:"ok"`
	Error       string             `json:"error"`
	From        string             `json:"from"`
	To          string             `json:"to"`
	DowntimeMs  float64            `json:"downtime_ms"`
	TotalMs     float64            `json:"total_ms"`
	PhasesMs    map[string]float64 `json:"phases_ms"`
	BytesOnWire int64              `json:"bytes_on_wire"`
}

// TestProbeSurvivesMigrations: a client holds one TCP connection to the
// continuity probe and keeps sending every 5 ms while the probe is migrated
// around three nodes; no reset, every reply's byte count and CRC match.
func TestProbeSurvivesMigrations(t *testing.T) {
	e := newEnv(t)
	e.up("--nodes", "3", "--clients", "1")
	var st status
	e.mustJSON(&st, "testbed", "status", "--json")
	var c ctr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "p", "--image", "probe", "--json", "--", "7000")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type out struct {
		r   probe.Report
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := probe.RunClient(ctx, probe.ClientConfig{Addr: net.JoinHostPort(c.IP, "7000"), Period: 5 * time.Millisecond,
			LineSize: 64, Conns: 2, Drain: 3 * time.Second, Dialer: nsDialer{linux.NetNSPath(st.Clients[0].NetNS)}})
		done <- out{r, err}
	}()
	time.Sleep(300 * time.Millisecond)

	const n = 20
	for i := 0; i < n; i++ {
		to := st.Nodes[(i+1)%3].Name
		var res migResult
		e.mustJSON(&res, "migrate", "p", "--to", to, "--json")
		if !res.OK || res.To != to {
			t.Fatalf("migration %d to %s: %+v", i, to, res)
		}
		if res.DowntimeMs <= 0 || res.BytesOnWire <= 0 || res.PhasesMs["dump"] <= 0 || res.PhasesMs["transfer"] <= 0 {
			t.Errorf("migration %d: implausible result %+v", i, res)
		}
		t.Logf("migration %d -> %s: downtime %.1f ms, phases %v", i, to, res.DowntimeMs, res.PhasesMs)
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	o := <-done
	if o.err != nil {
		t.Fatalf("probe client: %v", o.err)
	}
	r := o.r
	t.Logf("client: %d requests, %d replies, max gap %v, resets %d, mismatches %d", r.Requests, r.Replies, r.MaxGap, r.Resets, r.Mismatches)
	if r.Resets != 0 || r.ConnErrors != 0 || r.Mismatches != 0 || r.Unanswered != 0 {
		t.Fatalf("continuity broken: %s (errors %v)", r.Problem(), r.Errors)
	}
	if r.Replies < 100 {
		t.Fatalf("only %d replies", r.Replies)
	}
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	want := st.Nodes[n%3].Name
	if len(ps) != 1 || ps[0].Node != want || ps[0].IP != c.IP {
		t.Fatalf("after %d migrations ps = %+v, want p on %s with IP %s", n, ps, want, c.IP)
	}
	_ = fmt.Sprint
}

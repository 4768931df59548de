package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/netplane"
)

// TestAddressReachesItsNewService: a service runs, migrates under a
// client's traffic and is removed; a new one on its first node gets
// another address (the released one cools down) and is reached at once,
// its MAC pinned to its own port, whatever the bridge learned before.
func TestAddressReachesItsNewService(t *testing.T) {
	e, st, c := probeTestbed(t)
	clientNS := linux.NetNSPath(st.Clients[0].NetNS)
	addr := net.JoinHostPort(c.IP, "7000")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lc, err := runLiveClient(ctx, &wg, clientNS, addr, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct{ to, strategy string }{{"node1", "stop-and-copy"}, {"node2", "pre-copy"}, {"node1", "post-copy"}} {
		var res migResult
		e.mustJSON(&res, "migrate", "p", "--to", step.to, "--strategy", step.strategy, "--json")
		if !res.OK {
			t.Fatalf("migration %d to %s: %+v", i, step.to, res)
		}
		base := lc.replies.Load()
		for deadline := time.Now().Add(20 * time.Second); lc.replies.Load() < base+5; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no replies after migration %d", i)
			}
		}
	}
	cancel()
	wg.Wait()
	e.must("rm", "p")

	var q ctr
	e.mustJSON(&q, "run", "--node", "node0", "--name", "q", "--image", "probe", "--json", "--", "7000")
	// The released address cools down before it is handed out again (a
	// node the withdrawal missed may still send it to the old node); once
	// it is, the pin checked below makes it reach the new service.
	if q.IP == c.IP {
		t.Errorf("the new service got %s, released a moment ago", q.IP)
	}
	addr = net.JoinHostPort(q.IP, "7000")
	// Reached at once: the bridge ages a wrong entry out after 300 s.
	var lastErr error
	deadline := time.Now().Add(5 * time.Second)
	for {
		cc := &churnClient{}
		cc.once(context.Background(), clientNS, addr, 0)
		if cc.ok == 1 {
			break
		}
		lastErr = fmt.Errorf("%v", cc.errs)
		if time.Now().After(deadline) {
			t.Fatalf("the new service at %s was not reached within 5 s: %v", addr, lastErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// And node0's bridge holds its MAC on its own port, for good.
	var node0 string
	for _, n := range st.Nodes {
		if n.Name == "node0" {
			node0 = n.NetNS
		}
	}
	mac := netplane.MACFor(netip.MustParseAddr(q.IP)).String()
	out, err := exec.Command("nsenter", "--net="+linux.NetNSPath(node0), "bridge", "fdb", "show", "br", netplane.BridgeName).CombinedOutput()
	if err != nil {
		t.Fatalf("bridge fdb show: %v: %s", err, out)
	}
	var entries []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, mac+" ") {
			entries = append(entries, line)
		}
	}
	want := mac + " dev " + netplane.HostIfName("q") + " "
	if len(entries) != 1 || !strings.HasPrefix(entries[0], want) || !strings.Contains(entries[0], "sticky") {
		t.Fatalf("node0's bridge entries for %s: %q; want one sticky entry on %s", mac, entries, netplane.HostIfName("q"))
	}
}

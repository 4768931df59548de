package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/follow"
	"github.com/edgehop/edgehop/internal/testutil"
)

// podCtr is what `edgehop ps --json` says of a pod's member.
type podCtr struct {
	Name  string `json:"name"`
	Node  string `json:"node"`
	IP    string `json:"ip"`
	Pod   string `json:"pod"`
	NetOf string `json:"net_of"`
}

// checkPodListed: ps shows both members on node, sharing db's network.
func (e *env) checkPodListed(when, node string) {
	e.t.Helper()
	var ps []podCtr
	e.mustJSON(&ps, "ps", "--json")
	got := map[string]podCtr{}
	for _, c := range ps {
		got[c.Name] = c
	}
	db, web := got["db"], got["web"]
	if len(ps) != 2 || db.Pod != "app" || web.Pod != "app" || db.NetOf != "" || web.NetOf != "db" || db.IP != web.IP || db.Node != node || web.Node != node {
		e.t.Fatalf("%s: ps = %+v; want db and web in pod app on %s, web in db's network", when, ps, node)
	}
}

// TestPodMigrates: a two-member pod (redis and its replica, which share
// one network namespace and address and are joined by a replication
// connection over loopback) migrates as one with each strategy. Every
// time, both members land on the new node in one namespace, the clients'
// connections to both and the loopback connection between them are kept,
// and the data is complete on both. A member cannot be migrated alone,
// nor the pod's first member removed before the others, and removing the
// pod leaves no namespace behind.
func TestPodMigrates(t *testing.T) {
	e := newEnv(t)
	st := servicesTestbed(e)
	const n, size = 5_000, 1000
	db, web := e.redisPair(st, n, size, true)
	link := replicaLinkID(t, db)
	e.checkPodListed("at the start", "node0")
	if _, errs, err := e.run("migrate", "web", "--to", "node1"); err == nil || !strings.Contains(errs, "pod app") {
		t.Fatalf("a pod member migrated alone (err %v): %s", err, errs)
	}
	if _, errs, err := e.run("rm", "db"); err == nil || !strings.Contains(errs, "web") {
		t.Fatalf("the pod's first member was removed before web (err %v): %s", err, errs)
	}
	for i, strategy := range append(slices.Clone(strategies), "hybrid") {
		to := st.Nodes[(i+1)%3].Name
		e.migrateWhole("app", to, strategy, 2)
		e.checkPodListed("after "+strategy, to)
		e.checkGroupIntact("after "+strategy, db, web, to, link, n, size, i+1)
		for _, node := range st.Nodes {
			left, _ := os.ReadDir(filepath.Join(node.StateDir, "netns"))
			want := 0
			if node.Name == to {
				want = 1
			}
			if len(left) != want {
				t.Fatalf("after %s: %s has network namespaces %v, want %d", strategy, node.Name, names(left), want)
			}
		}
	}
	e.must("rm", "app")
	for _, node := range st.Nodes {
		if left, _ := os.ReadDir(filepath.Join(node.StateDir, "netns")); len(left) != 0 {
			t.Fatalf("rm app left network namespaces on %s: %v", node.Name, names(left))
		}
	}
}

// TestPodRollsBackAsOne: node1's runc fails to restore web, the pod's
// second member, while db is restored there. A pod is restored whole or
// not at all (its members share one namespace): db's copy on node1 gives
// up too, and both resume on node0, with the clients' connections, the
// loopback connection between them and the data.
func TestPodRollsBackAsOne(t *testing.T) {
	e := newEnv(t)
	wrap := runcWrapper(t, "web", "echo 'injected restore failure of web' >&2; exit 1")
	st := e.upWithRunc(map[string]string{"node1": wrap})
	const n, size = 5_000, 1000
	db, web := e.redisPair(st, n, size, true)
	link := replicaLinkID(t, db)
	res := e.migrateFails("app", "node1", "web's restore was made to fail")
	if res.OK || !strings.Contains(res.Error, "web") || len(res.Back) != 0 {
		t.Errorf("result: %+v; want web's failure named and nothing moved back (the pod never served on node1)", res)
	}
	e.checkPodListed("after the failed pod migration", "node0")
	e.checkGroupIntact("after the failed pod migration", db, web, "node0", link, n, size, 1)
	// node1 tears db's copy down once it reads the source's abort, which
	// the source sends as it reports: the namespace goes soon after.
	netns := filepath.Join(st.Nodes[1].StateDir, "netns")
	start := time.Now()
	testutil.Eventually(t, 30*time.Second, func() error {
		if left, _ := os.ReadDir(netns); len(left) != 0 {
			return fmt.Errorf("node1 kept network namespaces %v", names(left))
		}
		return nil
	})
	t.Logf("node1's namespaces gone %v after the checks", time.Since(start).Round(time.Millisecond))
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestPodDestinationCrashAtRestore: node1's agent dies right after it
// journals the first of the pod's members as restored, the other one
// restored too but not journaled yet. Restarted, it must settle the two
// alike: committing one and destroying the other (which would then resume
// on node0) would split the pod's namespace across two nodes. The pod
// ends whole on node1, with every connection and the data.
func TestPodDestinationCrashAtRestore(t *testing.T) {
	e := newEnvWith(t, failpointBinary) // its agents exit at the failpoint
	st := e.upWithRunc(nil)
	const n, size = 5_000, 1000
	db, web := e.redisPair(st, n, size, true)
	link := replicaLinkID(t, db)
	e.migrateAcrossCrash(st, 1, "pod-member-restored")
	log, err := os.ReadFile(filepath.Join(st.Nodes[1].StateDir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "failpoint reached") {
		t.Fatal("node1's agent never reached the failpoint")
	}
	if !strings.Contains(string(log), "settled as restored") {
		t.Error("node1 settled the pod's members without looking at each other's restore")
	}
	e.checkPodListed("after node1's agent died restoring the pod", "node1")
	e.checkGroupIntact("after node1's agent died restoring the pod", db, web, "node1", link, n, size, 1)
}

// TestPodDumpFailsRollsBack: web, the first of the pod to freeze (it
// depends on db), hands the pod's network over and then fails its dump.
// The pod stays on node0 and is reachable there again: the network is
// taken back whichever member handed it over, and every connection and
// the data survive.
func TestPodDumpFailsRollsBack(t *testing.T) {
	e := newEnv(t)
	st := e.upWithRunc(map[string]string{"node0": criuDumpWrapper(t, "web", failDump("injected dump failure of web"))})
	const n, size = 5_000, 1000
	db, web := e.redisPair(st, n, size, true)
	link := replicaLinkID(t, db)
	res := e.migrateFails("app", "node1", "web's dump was made to fail")
	if !strings.Contains(res.Error, "injected dump failure of web") {
		t.Errorf("result does not name web's dump failure: %+v", res)
	}
	e.checkPodListed("after web's failed dump", "node0")
	e.checkGroupIntact("after web's failed dump", db, web, "node0", link, n, size, 1)
}

// TestPodFollowsItsUser runs the main job with the followed redis as pod
// "app", a replica in its namespace replicating over loopback: the
// controller learns from the agents' heartbeats that "app" is a pod and
// moves it as one (its members' jobs) as the user walks across the three
// regions. Every migration of the pod succeeds and goes with the walk, it
// ends on the last node, no client request fails, and the replica holds
// every key the client wrote (its loopback link survived every move).
func TestPodFollowsItsUser(t *testing.T) {
	e := newEnv(t)
	testutil.RequireTool(t, "ping")
	demo := e.startDemo("--policy", "latency", "--speed", "25", "--pod", "app")
	out, stderr, err := demo.wait()
	if err != nil {
		t.Fatalf("demo --pod: %v\n%s\n%s", err, tail(stderr, 3000), tail(out, 2000))
	}
	var rep follow.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("demo --json: %v\n%s", err, tail(out, 2000))
	}
	if rep.Service != "app" {
		t.Fatalf("the controller followed %q, want the pod", rep.Service)
	}
	served := forwardMigrations(t, rep, "app")
	if len(served) == 0 || served[len(served)-1] != "node2" {
		t.Errorf("the pod ended on %v, want node2", served)
	}
	if rep.ClientErrors != 0 || !rep.DataVerified {
		t.Errorf("client errors %d %v, data verified (redis and its replica) %v", rep.ClientErrors, rep.ErrorSamples, rep.DataVerified)
	}
}

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/testbed"
)

// groupResult is `edgehop migrate GROUP --json`.
type groupResult struct {
	Group      string      `json:"group"`
	OK         bool        `json:"ok"`
	DowntimeMs float64     `json:"downtime_ms"`
	Members    []migResult `json:"members"`
	Back       []migResult `json:"moved_back"`
	Error      string      `json:"error"`
}

// redisGroup runs group "app" on node0: redis "db" holding n keys, and
// "web", a redis replica of db declared to depend on it, whose
// replication connection to db is the connection between the members. It
// returns a client connection to each, opened from client0.
func (e *env) redisGroup(st *testbed.State, n, size int) (db, web *redisConn) {
	e.t.Helper()
	base := []string{"redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"}
	var dbc, webc ctr
	e.mustJSON(&dbc, append([]string{"run", "--node", "node0", "--name", "db", "--group", "app", "--image", "services", "--json", "--"}, base...)...)
	e.mustJSON(&webc, append([]string{"run", "--node", "node0", "--name", "web", "--group", "app", "--after", "db", "--image", "services", "--json", "--"},
		append(base, "--replicaof", dbc.IP, "6379")...)...)
	ns := st.Clients[0].NetNSPath
	db, web = redisReady(e.t, ns, dbc.IP+":6379"), redisReady(e.t, ns, webc.IP+":6379")
	if err := db.fill(n, size); err != nil {
		e.t.Fatalf("fill db: %v", err)
	}
	e.waitReplicated(web, n)
	return db, web
}

// redisReady connects once redis answers; closed on cleanup.
func redisReady(t *testing.T, ns, addr string) *redisConn {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rc, err := dialRedis(ns, addr)
		if err == nil {
			if _, err = rc.do("PING"); err == nil {
				t.Cleanup(func() { rc.Close() })
				return rc
			}
			rc.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis at %s not answering: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitReplicated waits until the replica's link is up and it holds n keys.
func (e *env) waitReplicated(web *redisConn, n int) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := web.do("INFO", "replication")
		size, serr := web.do("DBSIZE")
		if err == nil && serr == nil && strings.Contains(info, "master_link_status:up") && size == strconv.Itoa(n) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("replica: %d keys wanted, DBSIZE %q (%v), replication %q (%v)", n, size, serr, info, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replicaLinkID is the id of the replica's connection on the master.
func replicaLinkID(t *testing.T, db *redisConn) string {
	t.Helper()
	list, err := db.do("CLIENT", "LIST", "TYPE", "replica")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(list)
	if len(f) == 0 || !strings.HasPrefix(f[0], "id=") {
		t.Fatalf("no replica connected to db: %q", list)
	}
	return f[0]
}

// checkGroupIntact: both members answer on the client's kept connections
// and from node; the replication connection between them never broke (the
// master made exactly one full sync and no partial one, and the replica's
// connection has the same id); a write on db reaches the replica.
func (e *env) checkGroupIntact(when string, db, web *redisConn, node, linkID string, n, size, writes int) {
	e.t.Helper()
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	for _, c := range ps {
		if c.Node != node {
			e.t.Fatalf("%s: %s is on %s, want the whole group on %s", when, c.Name, c.Node, node)
		}
	}
	if len(ps) != 2 {
		e.t.Fatalf("%s: ps = %+v, want db and web", when, ps)
	}
	stats, err := db.do("INFO", "stats")
	if err != nil {
		e.t.Fatal(err)
	}
	if full, partial := infoField(stats, "sync_full"), infoField(stats, "sync_partial_ok"); full != 1 || partial != 0 {
		e.t.Fatalf("%s: the replication connection broke: sync_full %d, sync_partial_ok %d", when, full, partial)
	}
	if id := replicaLinkID(e.t, db); id != linkID {
		e.t.Fatalf("%s: the replica's connection is %s, was %s", when, id, linkID)
	}
	// The test's own writes go to database 1, the data to database 0.
	key := "after-" + strconv.Itoa(writes)
	if _, err := db.do("SELECT", "1"); err != nil {
		e.t.Fatal(err)
	}
	if got, err := db.do("INCR", "writes"); err != nil || got != strconv.Itoa(writes) {
		e.t.Fatalf("%s: INCR on db's kept connection = %q, %v; want %d", when, got, err, writes)
	}
	if _, err := db.do("SET", key, "x"); err != nil {
		e.t.Fatal(err)
	}
	if _, err := web.do("SELECT", "1"); err != nil {
		e.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err := web.do("GET", key); err == nil && got == "x" {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: a write on db never reached the replica", when)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := web.do("SELECT", "0"); err != nil {
		e.t.Fatal(err)
	}
	if err := web.verify(n, size); err != nil {
		e.t.Fatalf("%s: the replica's data: %v", when, err)
	}
}

// TestGroupMigrates: a two-member group (redis and its replica, which
// depends on it, joined by the replication connection) migrates as one
// with each strategy. Every time the whole group lands on the new node,
// the clients' connections to both members and the connection between
// them are kept, and the data is complete on both.
func TestGroupMigrates(t *testing.T) {
	e := newEnv(t)
	st := servicesTestbed(e)
	const n, size = 5_000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	for i, strategy := range strategies {
		to := st.Nodes[(i+1)%3].Name
		var res groupResult
		e.mustJSON(&res, "migrate", "app", "--to", to, "--strategy", strategy, "--json")
		if !res.OK || len(res.Members) != 2 || len(res.Back) != 0 {
			t.Fatalf("%s: %+v", strategy, res)
		}
		for _, m := range res.Members {
			if !m.OK || m.To != to {
				t.Fatalf("%s: member %+v", strategy, m)
			}
		}
		t.Logf("%s -> %s: group downtime %.1f ms (members %.1f, %.1f)", strategy, to, res.DowntimeMs, res.Members[0].DowntimeMs, res.Members[1].DowntimeMs)
		e.checkGroupIntact("after "+strategy, db, web, to, link, n, size, i+1)
	}
}

// TestGroupRollsBackAsOne: the destination's runc fails to restore one
// member (web) while the other (db) is restored there. The group ends on
// its source as a whole: web resumes there, db is migrated back. The
// clients' connections, the replication connection and the data survive.
func TestGroupRollsBackAsOne(t *testing.T) {
	e := newEnv(t)
	realRunc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("skipped: runc not installed")
	}
	wrap := t.TempDir()
	script := "#!/bin/sh\nrestore=; web=\nfor a in \"$@\"; do [ \"$a\" = restore ] && restore=1; [ \"$a\" = web ] && web=1; done\n" +
		"[ -n \"$restore\" ] && [ -n \"$web\" ] && { echo 'injected restore failure of web' >&2; exit 1; }\nexec " + realRunc + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(wrap, "runc"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := testbed.DefaultSpec(e.name, 2, 1)
	spec.Clients[0].Link.RateBps = 1_000_000_000
	st := e.upAPI(spec, testbed.Options{AgentEnv: map[string][]string{"node1": {"PATH=" + wrap + ":" + os.Getenv("PATH")}}})
	e.logsOnFailure(st)
	const n, size = 5_000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	out, errs, err := e.run("migrate", "app", "--to", "node1", "--json")
	if err == nil {
		t.Fatal("the group migrated although web's restore was made to fail")
	}
	var res groupResult
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
		t.Fatalf("result: %v\n%s\n%s", jerr, out, errs)
	}
	t.Logf("result: ok=%v error=%q", res.OK, res.Error)
	for _, m := range res.Members {
		t.Logf("  -> %s: ok=%v %s", m.To, m.OK, m.Error)
	}
	for _, m := range res.Back {
		t.Logf("  moved back: %+v", m)
	}
	if res.OK || !strings.Contains(res.Error, "web") {
		t.Errorf("result does not name web's failure: %+v", res)
	}
	e.checkGroupIntact("after the failed group migration", db, web, "node0", link, n, size, 1)
}

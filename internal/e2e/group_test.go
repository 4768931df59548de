package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/testutil"
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
	return e.redisPair(st, n, size, false)
}

// redisPair runs redisGroup's members, or with pod those of pod "app":
// db first (the pod's namespace and address are made for it), then web
// in its namespace, on port 6380, replicating through loopback
// (127.0.0.1:6379). web depends on db either way, so it freezes first:
// in the pod, a member other than the first does the pod's network part.
func (e *env) redisPair(st *testbed.State, n, size int, pod bool) (db, web *redisConn) {
	e.t.Helper()
	base := []string{"redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"}
	kind, webOpts, port := "--group", []string{"--after", "db"}, "6379"
	if pod {
		kind, port = "--pod", "6380"
	}
	var dbc, webc ctr
	e.mustJSON(&dbc, append([]string{"run", "--node", "node0", "--name", "db", kind, "app", "--image", "services", "--json", "--"}, base...)...)
	replicaOf := []string{"--replicaof", dbc.IP, "6379"}
	if pod {
		replicaOf = []string{"--port", port, "--replicaof", "127.0.0.1", "6379"}
	}
	e.mustJSON(&webc, slices.Concat([]string{"run", "--node", "node0", "--name", "web", kind, "app"}, webOpts,
		[]string{"--image", "services", "--json", "--"}, base, replicaOf)...)
	if pod && webc.IP != dbc.IP {
		e.t.Fatalf("pod members have addresses %s and %s, want one", dbc.IP, webc.IP)
	}
	ns := st.Clients[0].NetNSPath
	db, web = redisReady(e.t, ns, dbc.IP+":6379"), redisReady(e.t, ns, webc.IP+":"+port)
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
	for _, c := range ps {
		checkOwnCgroup(e.t, when, c)
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
// them are kept, and the data is complete on both. Then web moves alone,
// splitting the group: it no longer moves to a third node, and moved to
// web's node, db joins it there, the connections and data kept.
func TestGroupMigrates(t *testing.T) {
	e := newEnv(t)
	st := servicesTestbed(e)
	const n, size = 5_000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	for i, strategy := range strategies {
		to := st.Nodes[(i+1)%3].Name
		e.migrateWhole("app", to, strategy, 2)
		e.checkGroupIntact("after "+strategy, db, web, to, link, n, size, i+1)
	}
	// Split: web moves alone. The group then moves only to where it can
	// be made whole, and db joins web there as one unit.
	k := len(strategies)
	at, alone, third := st.Nodes[k%3].Name, st.Nodes[(k+1)%3].Name, st.Nodes[(k+2)%3].Name
	var mr migResult
	e.mustJSON(&mr, "migrate", "web", "--to", alone, "--json")
	if !mr.OK {
		t.Fatalf("web alone to %s: %+v", alone, mr)
	}
	if out := e.must("ps"); strings.Count(out, "(split)") != 2 {
		t.Fatalf("ps, web moved alone, shows both members split? \n%s", out)
	}
	_, errs, err := e.run("migrate", "app", "--to", third)
	if err == nil || !strings.Contains(errs, "runs split across") {
		t.Fatalf("the split group moved to %s from %s and %s: err %v\n%s", third, at, alone, err, errs)
	}
	e.migrateWhole("app", alone, string(migration.StopAndCopy), 1)
	e.checkGroupIntact("made whole on "+alone, db, web, alone, link, n, size, k+1)
	if out := e.must("ps"); strings.Contains(out, "(split)") {
		t.Fatalf("ps, the group whole again, shows it split:\n%s", out)
	}
}

// TestGroupRollsBackAsOne: the destination's runc fails to restore one
// member (web) while the other (db) is restored there. The group ends on
// its source as a whole: web resumes there, db is migrated back. The
// clients' connections, the replication connection and the data survive.
func TestGroupRollsBackAsOne(t *testing.T) {
	e := newEnv(t)
	wrap := runcWrapper(t, "web", "echo 'injected restore failure of web' >&2; exit 1")
	st := e.upWithRunc(map[string]string{"node1": wrap})
	const n, size = 5_000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	res := e.migrateFails("app", "node1", "web's restore was made to fail")
	if res.OK || !strings.Contains(res.Error, "web") {
		t.Errorf("result does not name web's failure: %+v", res)
	}
	e.checkGroupIntact("after the failed group migration", db, web, "node0", link, n, size, 1)
}

// migrateWhole migrates group to node to with strategy, which must move
// all its members there.
func (e *env) migrateWhole(group, to, strategy string, members int) {
	e.t.Helper()
	var res groupResult
	e.mustJSON(&res, "migrate", group, "--to", to, "--strategy", strategy, "--json")
	if !res.OK || len(res.Members) != members || len(res.Back) != 0 {
		e.t.Fatalf("%s: %+v", strategy, res)
	}
	for _, m := range res.Members {
		if !m.OK || m.To != to {
			e.t.Fatalf("%s: member %+v", strategy, m)
		}
	}
	e.t.Logf("%s -> %s: %s downtime %.1f ms (longest member)", strategy, to, group, res.DowntimeMs)
}

// migrateFails runs `edgehop migrate group --to to --json`, which must
// fail (why), and returns and logs its result.
func (e *env) migrateFails(group, to, why string) groupResult {
	e.t.Helper()
	out, errs, err := e.run("migrate", group, "--to", to, "--json")
	if err == nil {
		e.t.Fatalf("%s migrated although %s", group, why)
	}
	var res groupResult
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
		e.t.Fatalf("result: %v\n%s\n%s", jerr, out, errs)
	}
	e.t.Logf("result: ok=%v error=%q", res.OK, res.Error)
	for _, m := range res.Members {
		e.t.Logf("  -> %s: ok=%v %s", m.To, m.OK, m.Error)
	}
	for _, m := range res.Back {
		e.t.Logf("  moved back: %+v", m)
	}
	return res
}

// TestGroupRestoreStoppedWhenSourceRollsBack: in a post-copy group
// migration, web (which depends on db, so it freezes first) has its state
// on node1 and is being restored there when db's dump fails on node0. The
// group rolls back, and node1 must stop web's restore at once: restoring
// lazily from a page server the source has shut down, it would otherwise
// hold the name on node1 until the restore's deadline. web's restore on
// node1 is made to take two minutes once its gate opened (its CRIU waits
// before it starts), so the abort arrives in the middle of it. Afterwards
// the group is whole on node0 and node1's job ended with the source's
// reason, no job running there.
func TestGroupRestoreStoppedWhenSourceRollsBack(t *testing.T) {
	e := newEnv(t)
	dumpFails := criuDumpWrapper(t, "db", failDump("injected dump failure of db"))
	slowRestore := criuRestoreWrapper(t, "web", "sleep 120")
	st := e.upWithRunc(map[string]string{"node0": dumpFails, "node1": slowRestore})
	const n, size = 2_000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	out, errs, err := e.run("migrate", "app", "--to", "node1", "--strategy", "post-copy", "--json")
	if err == nil {
		t.Fatal("the group migrated although db's dump was made to fail")
	}
	var res groupResult
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil {
		t.Fatalf("result: %v\n%s\n%s", jerr, out, errs)
	}
	t.Logf("result: ok=%v error=%q", res.OK, res.Error)
	if res.OK || !strings.Contains(res.Error, "injected dump failure of db") {
		t.Errorf("result does not give db's dump failure: %+v", res)
	}
	// node1's side of web ends with the source's abort, well before the
	// slowed restore could have finished (or reached its deadline).
	deadline := time.Now().Add(20 * time.Second)
	for {
		var jobs []api.Job
		out, _, err := e.run("migrations", "--node", "node1", "--json")
		running := -1
		if err == nil && json.Unmarshal([]byte(out), &jobs) == nil {
			running = 0
			for _, j := range jobs {
				if j.State == "running" {
					running++
				}
			}
		}
		if running == 0 && len(jobs) == 2 {
			for _, j := range jobs {
				t.Logf("node1 job %s %s: %s", j.Container, j.Role, j.State)
				if j.State != "aborted" {
					t.Errorf("node1's job for %s ended %s, want aborted", j.Container, j.State)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node1 still runs a migration job 20 s after the group rolled back: %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	log, err := os.ReadFile(filepath.Join(st.Nodes[1].StateDir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "restore stopped: node0 aborted") {
		t.Errorf("node1's log does not say web's restore was stopped by node0's abort")
	}
	// db's destination was waiting for its images: it reports the
	// source's reason, not the message it met instead of a stream.
	if strings.Contains(string(log), "protocol violation") {
		t.Errorf("node1 reports the source's abort as a protocol violation")
	}
	e.checkGroupIntact("after the group rolled back during web's restore", db, web, "node0", link, n, size, 1)
}

// TestGroupPostCopySourceCrash: the source agent is killed (SIGKILL) in
// the middle of a post-copy group migration: web's lazy dump is serving
// its pages and web waits for db, whose dump is made to start 3 s late.
// Restarted by the supervisor, the agent finds web's dump still running
// and db's runc still dumping. It must end with the group whole on node0,
// each member running once, with the clients' connections, the
// connection between the members, and the data: web's aborted lazy dump
// leaves its connections in repair mode, db's finished dump is restored
// here.
func TestGroupPostCopySourceCrash(t *testing.T) {
	e := newEnv(t)
	slowDump := criuDumpWrapper(t, "db", "sleep 3")
	st := e.upWithRunc(map[string]string{"node0": slowDump})
	const n, size = 2_000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node0 := api.NewUnixClient(st.Nodes[0].Socket)
	jobs, err := node0.StartGroupMigration(ctx, "app", api.MigrateRequest{To: "node1", Strategy: "post-copy"})
	if err != nil {
		t.Fatal(err)
	}
	var webJob string
	for _, j := range jobs {
		if j.Container == "web" {
			webJob = j.ID
		}
	}
	if webJob == "" {
		t.Fatalf("no job for web: %+v", jobs)
	}
	phaseOn := func(node int, id string) migration.Phase { return journalPhase(st.Nodes[node].StateDir, id) }
	phase := func(id string) migration.Phase { return phaseOn(0, id) }
	// web's state is on node1 (its source, frozen, waits for db).
	for {
		dst := phaseOn(1, webJob)
		if phase(webJob) == migration.Frozen && (dst == migration.Transferred || dst == migration.Restored) {
			break
		}
		if ctx.Err() != nil || phase(webJob).Final() {
			t.Fatalf("web's state never reached node1 before its commit (source at %q, destination at %q)", phase(webJob), dst)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pidFile := filepath.Join(st.Nodes[0].StateDir, "agent.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatalf("kill node0's agent %d: %v", old, err)
	}
	t.Logf("killed node0's agent (pid %d) with web's lazy dump serving and db's dump pending", old)
	for {
		var ps []ctr
		out, _, err := e.run("ps", "--json")
		b, _ := os.ReadFile(pidFile)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if pid > 0 && pid != old && err == nil && json.Unmarshal([]byte(out), &ps) == nil && len(ps) == 2 &&
			ps[0].Node == "node0" && ps[1].Node == "node0" && ps[0].Status == "running" && ps[1].Status == "running" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the group did not settle on node0: ps %s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, j := range jobs {
		for {
			p := phase(j.ID)
			if p.Final() {
				t.Logf("%s: %s", j.Container, p)
				if p != migration.RolledBack {
					t.Errorf("%s's migration ended %s, want %s", j.Container, p, migration.RolledBack)
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s's migration never ended (at %s)", j.Container, p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	e.checkGroupIntact("after node0's agent died in a post-copy group migration", db, web, "node0", link, n, size, 1)
}

// TestGroupCommitSurvivesSourceCrash: the source agent dies right after
// journaling the group's commit and before either member journals its own
// (a failpoint: no outside observer can hit that moment), while one
// member's destination is still restoring it. Restarted by the
// testbed's supervisor, the agent must hand both members over, as their
// group committed, rather than roll back those whose destination had not
// finished restoring: the group ends whole on the destination, with the
// clients' connections, the connection between the members, and the data.
func TestGroupCommitSurvivesSourceCrash(t *testing.T) {
	e := newEnvWith(t, failpointBinary) // its agents exit at the failpoint
	// db's restore on node1 takes 5 s longer: the restarted source finds
	// it still restoring there (web restored), the case where rolling
	// back on the member's own account would split the group.
	wrap := runcWrapper(t, "db", "sleep 5")
	st := e.upWithRunc(map[string]string{"node1": wrap})
	const n, size = 20, 1 << 20
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	e.migrateAcrossCrash(st, 0, "unit-committed")
	log, err := os.ReadFile(filepath.Join(st.Nodes[0].StateDir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	crashed := strings.Contains(string(log), "failpoint reached")
	handed := strings.Count(string(log), "its group had committed: committing")
	t.Logf("source agent crashed at the failpoint: %v; members it handed over on recovery because their group had committed: %d", crashed, handed)
	if !crashed {
		t.Fatal("the source agent never reached the failpoint")
	}
	if handed == 0 {
		t.Error("the restarted source settled the members without looking at their group's commit")
	}
	e.checkGroupIntact("after the source agent died at the group's commit", db, web, "node1", link, n, size, 1)
}

// migrateAcrossCrash arms failpoint on the agent of st.Nodes[node],
// starts moving group "app" (two members) from node0 to node1 with
// stop-and-copy, and waits, at most 3 minutes, until the failpoint has
// fired and both members run on node1. Only an agent built with the tag
// failpoints has failpoints: e must come from newEnvWith(t,
// failpointBinary).
func (e *env) migrateAcrossCrash(st *testbed.State, node int, failpoint string) {
	e.t.Helper()
	fp := filepath.Join(st.Nodes[node].StateDir, "failpoint-"+failpoint)
	if err := os.WriteFile(fp, nil, 0o600); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := api.NewUnixClient(st.Nodes[0].Socket).StartGroupMigration(ctx, "app", api.MigrateRequest{To: "node1", Strategy: "stop-and-copy"}); err != nil {
		e.t.Fatal(err)
	}
	for {
		var ps []ctr
		_, ferr := os.Stat(fp)
		out, _, err := e.run("ps", "--json")
		if errors.Is(ferr, os.ErrNotExist) && err == nil && json.Unmarshal([]byte(out), &ps) == nil && len(ps) == 2 &&
			ps[0].Node == "node1" && ps[1].Node == "node1" && ps[0].Status == "running" && ps[1].Status == "running" {
			return
		}
		if ctx.Err() != nil {
			e.t.Fatalf("app did not settle whole on node1 (failpoint left: %v): ps %s", ferr == nil, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// upWithRunc brings up two nodes and a client on a 1 Gbit/s access link,
// each node of wrappers with its agent finding runc in the directory
// given (a runcWrapper) before the real one.
func (e *env) upWithRunc(wrappers map[string]string) *testbed.State {
	e.t.Helper()
	agentEnv := map[string][]string{}
	for node, dir := range wrappers {
		agentEnv[node] = []string{"PATH=" + dir + ":" + os.Getenv("PATH")}
	}
	spec := testbed.DefaultSpec(e.name, 2, 1)
	spec.Clients[0].Link.RateBps = 1_000_000_000
	st := e.upAPI(spec, testbed.Options{AgentEnv: agentEnv})
	e.logsOnFailure(st)
	return st
}

// runcWrapper returns a directory holding a runc that runs the shell
// command action before restoring container name, then the real runc; an
// agent whose PATH starts with it restores name that way.
func runcWrapper(t *testing.T, name, action string) string {
	return runcWrapperFor(t, "restore", name, action)
}

// criuDumpWrapper returns a directory holding a runc whose CRIU runs the
// shell command action before it dumps container name, once the dump's
// gate has opened (the agent has frozen the service); INJECT_LOG names
// the dump's CRIU log. The lazy dump's feature check and anything else
// go straight to the real criu. It needs the criu shim, which tells CRIU's
// request (EDGEHOP_CRIU_REQUEST; 1 is a dump).
func criuDumpWrapper(t *testing.T, name, action string) string {
	t.Helper()
	setup := "w=; for a in \"$@\"; do [ \"$w\" = 1 ] && export INJECT_LOG=\"$a/dump.log\"; w=; [ \"$a\" = --work-path ] && w=1; done"
	return criuWrapper(t, "checkpoint", 1, name, action, setup)
}

// criuRestoreWrapper returns a directory holding a runc whose CRIU runs
// the shell command action before it restores container name, once the
// restore's gate has opened (the images are here: the frozen window). The
// shim then waits at the gate itself, without its library preloaded into
// CRIU, and starts the wrapped criu after it (2 is a restore).
func criuRestoreWrapper(t *testing.T, name, action string) string {
	t.Helper()
	return criuWrapper(t, "restore", 2, name, action, "unset EDGEHOP_CRIU_GATE_LIB")
}

// criuWrapper is a runc wrapper for its subcommand sub of container name
// that runs the shell command setup and has the shim start a criu that
// runs action first for requests of type req (criu_req_type's number).
func criuWrapper(t *testing.T, sub string, req int, name, action, setup string) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(filepath.Dir(binary(t)), runc.ShimName)); err != nil {
		t.Skipf("skipped: no %s next to the edgehop binary (no C compiler at build): %v", runc.ShimName, err)
	}
	realCRIU, err := exec.LookPath("criu")
	if err != nil {
		t.Skip("skipped: criu not installed")
	}
	criu := filepath.Join(t.TempDir(), "criu")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$EDGEHOP_CRIU_REQUEST\" = %d ]; then %s; fi\nexec %s \"$@\"\n", req, action, realCRIU)
	if err := os.WriteFile(criu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return runcWrapperFor(t, sub, name, setup+"; export EDGEHOP_CRIU="+criu)
}

// failDump is a criuDumpWrapper action that fails the dump a second
// after the freeze, with msg as CRIU's error.
func failDump(msg string) string {
	return "sleep 1; echo \"(00.000000) Error (injected): " + msg + "\" >> \"$INJECT_LOG\"; exit 1"
}

// runcWrapperFor is runcWrapper for runc's subcommand sub (restore,
// checkpoint).
func runcWrapperFor(t *testing.T, sub, name, action string) string {
	t.Helper()
	realRunc, err := exec.LookPath("runc")
	if err != nil {
		t.Skip("skipped: runc not installed")
	}
	dir := t.TempDir()
	script := "#!/bin/sh\nsub=; it=\nfor a in \"$@\"; do [ \"$a\" = " + sub + " ] && sub=1; [ \"$a\" = " + name + " ] && it=1; done\n" +
		"if [ -n \"$sub\" ] && [ -n \"$it\" ]; then " + action + "; fi\nexec " + realRunc + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "runc"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// checkOwnCgroup fails the test unless c's /sys/fs/cgroup/memory, where
// it has one, shows the memory cgroup it is in, its own on its node
// (runc 1.1 restored a cgroup mount as the agent's cgroup).
func checkOwnCgroup(t *testing.T, when string, c ctr) {
	t.Helper()
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", c.Pid))
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", c.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var in string
	for _, l := range strings.Split(string(cg), "\n") {
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && f[1] == "memory" {
			in = f[2]
		}
	}
	if in == "" {
		return // no memory cgroup v1 hierarchy here
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == "/sys/fs/cgroup/memory" {
			if f[3] != in || !strings.HasSuffix(in, "-"+c.Node+"/"+c.Name) {
				t.Fatalf("%s: %s's /sys/fs/cgroup/memory shows cgroup %s; it is in %s, on %s", when, c.Name, f[3], in, c.Node)
			}
			return
		}
	}
	t.Fatalf("%s: %s has no /sys/fs/cgroup/memory", when, c.Name)
}

// TestControllerReunitesSplitGroup: a group following its user is split
// by moving one member alone to a node farther from the user. The
// controller sees it split, waits its policy's reunite_after, and moves
// that member back to the other's node (nearer the user) as one unit: the
// group runs whole there, with the clients' connections, the replication
// connection between the members and the data kept.
func TestControllerReunitesSplitGroup(t *testing.T) {
	e := newEnv(t)
	testutil.RequireTool(t, "ping")
	st := servicesTestbed(e)
	const n, size = 1000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	// node1 is 20 ms farther from everything: node0 is nearer the user.
	e.must("testbed", "link", "node1", "--delay", "10ms")
	e.must("user", "add", "alice", "--address", st.Clients[0].Address, "--x", "0")
	// A latency threshold the user never exceeds: only a reunite moves it.
	e.must("follow", "app", "--user", "alice", "--node", "node0", "--policy", "latency", "--threshold-ms", "1000",
		"--strategy", "pre-copy", "--reunite-after", "3s")
	var mr migResult
	e.mustJSON(&mr, "migrate", "web", "--to", "node1", "--json")
	if !mr.OK {
		t.Fatalf("web alone to node1: %+v", mr)
	}
	type svc struct {
		Name  string   `json:"name"`
		Node  string   `json:"node"`
		Split []string `json:"split"`
	}
	sawSplit := false
	deadline := time.Now().Add(90 * time.Second)
	for {
		var ss []svc
		e.mustJSON(&ss, "services", "--json")
		if len(ss) == 1 && len(ss[0].Split) == 2 {
			sawSplit = true
		}
		var ps []ctr
		e.mustJSON(&ps, "ps", "--json")
		whole := len(ps) == 2 && ps[0].Node == "node0" && ps[1].Node == "node0"
		if sawSplit && whole && len(ss) == 1 && ss[0].Split == nil && ss[0].Node == "node0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90 s: saw it split %v; services %+v; ps %+v", sawSplit, ss, ps)
		}
		time.Sleep(250 * time.Millisecond)
	}
	var es []struct {
		Data struct {
			Migrate bool   `json:"migrate"`
			From    string `json:"from"`
			To      string `json:"to"`
			Reason  string `json:"reason"`
		} `json:"data"`
	}
	e.mustJSON(&es, "decisions", "--json", "--limit", "50")
	var reunites []string
	for _, en := range es {
		d := en.Data
		if d.Migrate && strings.HasPrefix(d.Reason, "reunite") {
			reunites = append(reunites, d.From+" -> "+d.To)
			t.Logf("decision %s -> %s: %s", d.From, d.To, d.Reason)
		}
	}
	if len(reunites) != 1 || reunites[0] != "node1 -> node0" {
		t.Errorf("reunite decisions %v, want one, node1 -> node0", reunites)
	}
	e.checkGroupIntact("made whole by the controller", db, web, "node0", link, n, size, 1)
}

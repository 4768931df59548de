package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

// faultBed is a two-node testbed whose node links are slow enough (200
// Mbit/s) that every phase of a migration of redis holding 50 MB lasts long
// enough to be hit, with an open client connection to redis on node0.
type faultBed struct {
	e          *env
	st         *testbed.State
	rc         *redisConn
	addr       string
	keys, size int // what redis holds
}

const faultKeys, faultSize = 50_000, 1000

func newFaultBed(t *testing.T) *faultBed { return newFaultBedHolding(t, faultKeys, faultSize) }

// newFaultBedHolding is newFaultBed with redis holding keys values of
// size bytes.
func newFaultBedHolding(t *testing.T, keys, size int) *faultBed {
	return newFaultBedIn(newEnv(t), keys, size)
}

// newFaultBedIn is newFaultBedHolding in env e (one whose agents run the
// failpoints binary, for instance).
func newFaultBedIn(e *env, keys, size int) *faultBed {
	spec := testbed.DefaultSpec(e.name, 2, 1)
	for i := range spec.Nodes {
		spec.Nodes[i].Link.RateBps = 200_000_000
	}
	spec.Clients[0].Link.RateBps = 1_000_000_000
	st := e.upAPI(spec, testbed.Options{})
	e.logsOnFailure(st)
	addr, rc := e.redisWithData(st, keys, size)
	return &faultBed{e: e, st: st, rc: rc, addr: addr, keys: keys, size: size}
}

func (f *faultBed) node(name string) testbed.Member {
	m, ok := f.st.Node(name)
	if !ok {
		f.e.t.Fatalf("no node %s", name)
	}
	return m
}

func (f *faultBed) client(node string) *api.Client { return api.NewUnixClient(f.node(node).Socket) }

// phase is what node's journal says about migration id ("" before it has
// a record).
func (f *faultBed) phase(node, id string) migration.Phase {
	return journalPhase(f.node(node).StateDir, id)
}

// journalPhase is what the journal in a node's state directory says about
// migration id ("" before it has a record).
func journalPhase(stateDir, id string) migration.Phase {
	return journal.PhaseIn(filepath.Join(stateDir, "journal"), id)
}

// receiving reports whether node is receiving the images into its
// scratch space (transfer.RecvDir fills a partial directory: redis-in's,
// or with the restore started on the layer, redis-in-images').
func (f *faultBed) receiving(node string) bool {
	m, _ := filepath.Glob(filepath.Join(f.node(node).StateDir, "scratch", ".redis-in*.partial-*"))
	return len(m) > 0
}

// agentPID reads node's agent pid file.
func (f *faultBed) agentPID(node string) int {
	b, err := os.ReadFile(filepath.Join(f.node(node).StateDir, "agent.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// kill kills node's agent with SIGKILL and waits until the testbed's
// supervisor started it again and it answers.
func (f *faultBed) kill(node string) {
	t := f.e.t
	t.Helper()
	old := f.agentPID(node)
	if old <= 0 {
		t.Fatalf("no agent pid for %s", node)
	}
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatalf("kill agent %s: %v", node, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if pid := f.agentPID(node); pid > 0 && pid != old {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := f.client(node).Info(ctx)
			cancel()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent of %s did not come back after a kill (pid was %d)", node, old)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// start starts moving redis from node0 to node1 and returns the job's id.
func (f *faultBed) start(strategy string) string {
	t := f.e.t
	t.Helper()
	j, err := f.client("node0").StartMigration(context.Background(), "redis", api.MigrateRequest{To: "node1", Strategy: strategy,
		Compression: "off", LinkBps: 200_000_000})
	if err != nil {
		t.Fatalf("start migration: %v", err)
	}
	return j.ID
}

// waitFor polls cond every millisecond until it holds.
func (f *faultBed) waitFor(what string, cond func() bool) {
	t := f.e.t
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle waits until both sides' journals say migration id ended, and
// returns the source's outcome.
func (f *faultBed) settle(id string) migration.Phase {
	t := f.e.t
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		src, dst := f.phase("node0", id), f.phase("node1", id)
		if src.Final() && (dst == "" || dst.Final()) {
			return src
		}
		if time.Now().After(deadline) {
			t.Fatalf("migration %s not settled: source %q, destination %q", id, src, dst)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check asserts that exactly one copy of redis runs, on want, answers at
// its address on the connection opened before, with every key, and that
// nothing of it is left on the other node.
func (f *faultBed) check(want string) {
	t := f.e.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var ps []ctr
	for {
		out, _, err := f.e.run("ps", "--json")
		ps = nil
		if err == nil && json.Unmarshal([]byte(out), &ps) == nil && len(ps) == 1 && ps[0].Node == want && ps[0].Status == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want redis running on %s only, ps says %+v (err %v)", want, ps, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := f.rc.verify(f.keys, f.size); err != nil {
		t.Fatalf("the client's connection or the data after the fault: %v", err)
	}
	other := "node0"
	if want == "node0" {
		other = "node1"
	}
	m := f.node(other)
	if left, _ := os.ReadDir(filepath.Join(m.StateDir, "containers")); len(left) != 0 {
		t.Errorf("%s kept container state %v", other, left)
	}
	if left, _ := os.ReadDir(filepath.Join(m.StateDir, "netns")); len(left) != 0 {
		t.Errorf("%s kept namespaces %v", other, left)
	}
	for _, n := range f.st.Nodes {
		scratch, _ := os.ReadDir(filepath.Join(n.StateDir, "scratch"))
		if len(scratch) != 0 {
			var names []string
			for _, s := range scratch {
				names = append(names, s.Name())
			}
			t.Errorf("%s kept checkpoint data %v", n.Name, names)
		}
		ms, _ := linux.MountsUnder(filepath.Join(n.StateDir, "containers"))
		wantMounts := 0
		if n.Name == want {
			wantMounts = 1 // the service's rootfs
		}
		if len(ms) != wantMounts {
			t.Errorf("%s has container mounts %v, want %d", n.Name, ms, wantMounts)
		}
		if n.Name == want && netnsLocked(f.st, n.Name, "redis") {
			t.Errorf("CRIU lock chain left on %s", n.Name)
		}
	}
}

// TestKillAgentMidMigration kills -9 the source's or the destination's
// agent at each phase of a migration. The testbed's supervisor starts it
// again, the agent settles the migration from its journal, and exactly one
// copy of the service runs, with its data and its client's connection.
func TestKillAgentMidMigration(t *testing.T) {
	type step struct {
		victim   string
		strategy string
		// trigger holds when the victim must die.
		trigger func(f *faultBed, id string) bool
		// where the service must end up.
		want string
	}
	phaseIs := func(node string, ps ...migration.Phase) func(f *faultBed, id string) bool {
		return func(f *faultBed, id string) bool {
			got := f.phase(node, id)
			for _, p := range ps {
				if got == p {
					return true
				}
			}
			return false
		}
	}
	transferring := func(f *faultBed, id string) bool {
		return f.phase("node0", id) == migration.Frozen && f.receiving("node1")
	}
	done := func(f *faultBed, id string) bool { return f.phase("node0", id) == migration.Done }
	finalDelta := func(f *faultBed, id string) bool {
		// (redis-in-images-pages: the destination's restore waits at its
		// gate on the image directory.)
		_, err := os.Stat(filepath.Join(f.node("node1").StateDir, "scratch", "redis-in-pages"))
		_, gerr := os.Stat(filepath.Join(f.node("node1").StateDir, "scratch", "redis-in-images-pages"))
		return f.phase("node0", id) == migration.Frozen && (err == nil || gerr == nil)
	}
	for _, tc := range []struct {
		name string
		step
	}{
		{"source/prepare", step{"node0", "stop-and-copy", phaseIs("node0", migration.Preparing), "node0"}},
		{"source/live-rounds", step{"node0", "pre-copy", phaseIs("node0", migration.LiveRounds), "node0"}},
		{"source/dump", step{"node0", "stop-and-copy", phaseIs("node0", migration.Frozen), "node0"}},
		{"source/transfer", step{"node0", "stop-and-copy", transferring, "node0"}},
		{"source/after-restore", step{"node0", "stop-and-copy", phaseIs("node1", migration.Restored, migration.Committed, migration.Done), "node1"}},
		{"source/after-commit", step{"node0", "stop-and-copy", done, "node1"}},
		{"destination/prepare", step{"node1", "stop-and-copy", phaseIs("node1", migration.Prepared), "node0"}},
		{"destination/live-rounds", step{"node1", "pre-copy", phaseIs("node0", migration.LiveRounds), "node0"}},
		{"destination/dump", step{"node1", "stop-and-copy", phaseIs("node1", migration.Frozen), "node0"}},
		{"destination/transfer", step{"node1", "stop-and-copy", transferring, "node0"}},
		// Pre-copy's final delta crosses while CRIU dumps, into a
		// directory of its own on the destination.
		{"source/final-delta", step{"node0", "pre-copy", finalDelta, "node0"}},
		{"destination/final-delta", step{"node1", "pre-copy", finalDelta, "node0"}},
		{"destination/restore", step{"node1", "stop-and-copy", phaseIs("node1", migration.Transferred), "node0"}},
		{"destination/after-commit", step{"node1", "stop-and-copy", done, "node1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFaultBed(t)
			id := f.start(tc.strategy)
			f.waitFor(tc.name, func() bool { return tc.trigger(f, id) })
			killedIn := f.phase(tc.victim, id)
			f.kill(tc.victim)
			out := f.settle(id)
			t.Logf("killed %s's agent in its phase %q; the source ended %s", tc.victim, killedIn, out)
			f.check(tc.want)
		})
	}
}

// TestKillAgentMidMigration300MB: the same with redis holding 300 MB
// (300 values of 1 MB), the source's and the destination's agent killed
// while the state crosses the link.
func TestKillAgentMidMigration300MB(t *testing.T) {
	transferring := func(f *faultBed, id string) bool {
		return f.phase("node0", id) == migration.Frozen && f.receiving("node1")
	}
	for _, victim := range []string{"node0", "node1"} {
		t.Run(victim, func(t *testing.T) {
			f := newFaultBedHolding(t, 300, 1<<20)
			id := f.start("stop-and-copy")
			f.waitFor("the transfer", func() bool { return transferring(f, id) })
			f.kill(victim)
			out := f.settle(id)
			t.Logf("killed %s's agent during the transfer of 300 MB; the source ended %s", victim, out)
			f.check("node0")
		})
	}
}

// TestKillDestinationPostCopyIdle kills -9 the destination's agent while
// it restores a post-copy migration of a small redis. The prefetch may
// have crossed already and the tunnel to the source's page server be
// idle; the dead agent's kernel then ends it with a plain FIN, which must
// read as a failure there (CRIU's lazy dump takes end of file for a
// finished session and kills the source's service). The service resumes
// on the source with its data and its client's connection.
func TestKillDestinationPostCopyIdle(t *testing.T) {
	f := newFaultBedHolding(t, 100, 1000)
	id := f.start("post-copy")
	f.waitFor("the restore", func() bool { return f.phase("node1", id) == migration.Transferred })
	f.kill("node1")
	out := f.settle(id)
	t.Logf("killed node1's agent during the restore; the source ended %s", out)
	f.check("node0")
}

// TestPartitionMidMigration cuts the destination's link (100% loss) while
// the state crosses it, and separately after the restore. The source
// rolls back in the first case (its send fails within TCP_USER_TIMEOUT),
// the destination keeps the service in the second; once the link is back,
// exactly one copy runs with its data and connection.
func TestPartitionMidMigration(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trigger func(f *faultBed, id string) bool
		want    string
		heal    func(f *faultBed, id string) bool // when to restore the link
	}{
		{"during-transfer", func(f *faultBed, id string) bool { return f.receiving("node1") }, "node0",
			func(f *faultBed, id string) bool { return f.phase("node0", id).Final() }},
		{"after-restore", func(f *faultBed, id string) bool {
			p := f.phase("node1", id)
			return p == migration.Restored || p == migration.Committed || p == migration.Done
		}, "node1",
			func(f *faultBed, id string) bool { return f.phase("node1", id).Final() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFaultBed(t)
			id := f.start("stop-and-copy")
			f.waitFor("the partition's moment", func() bool { return tc.trigger(f, id) })
			link := f.node("node1").Link
			cut := link
			cut.Loss = 1
			if err := testbed.SetLink(context.Background(), f.e.root, f.e.name, "node1", cut); err != nil {
				t.Fatalf("cut node1's link: %v", err)
			}
			f.waitFor("the side that decides alone to end", func() bool { return tc.heal(f, id) })
			time.Sleep(time.Second) // let the other side find its link dead
			if err := testbed.SetLink(context.Background(), f.e.root, f.e.name, "node1", link); err != nil {
				t.Fatalf("heal node1's link: %v", err)
			}
			out := f.settle(id)
			t.Logf("partition %s: the source ended %s", tc.name, out)
			f.check(tc.want)
		})
	}
}

// TestKillSourceBeforeFreeze kills -9 the source's agent before the
// freeze with each strategy, while redis's client holds its connection:
// the migration is aborted, the connection carries on (nothing the dead
// agent set on the service's traffic stays), and the next migration to
// the same destination succeeds (the destination's claim on the name is
// gone).
func TestKillSourceBeforeFreeze(t *testing.T) {
	for _, tc := range []struct {
		strategy string
		phase    migration.Phase
	}{
		{"post-copy", migration.Preparing},
		{"hybrid", migration.LiveRounds},
		{"pre-copy", migration.LiveRounds},
	} {
		t.Run(tc.strategy+"/"+string(tc.phase), func(t *testing.T) {
			f := newFaultBed(t)
			id := f.start(tc.strategy)
			f.waitFor(string(tc.phase), func() bool { return f.phase("node0", id) == tc.phase })
			f.kill("node0")
			if out := f.settle(id); out != migration.Aborted {
				t.Fatalf("the source ended %s, want aborted", out)
			}
			f.check("node0")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var res migResult
			err := f.client("node0").Migrate(ctx, "redis", api.MigrateRequest{To: "node1", Strategy: tc.strategy,
				Compression: "off", LinkBps: 200_000_000}, &res)
			if err != nil || !res.OK {
				t.Fatalf("the next migration to node1: %+v, %v", res, err)
			}
			f.check("node1")
		})
	}
}

// TestSourceSilentBeforeFreeze stops the source's agent (SIGSTOP, failpoint
// source-stop-rounds) as its live rounds start, the destination prepared:
// its TCP connection stays open and its kernel acknowledges, so only the
// destination's own bound (source_silence_ms, 3 s here) ends the wait. The
// destination drops its copy and its claim (journal aborted); once the
// source goes on, it aborts, the service never having stopped, and the
// next migration to that destination succeeds. In the partition case the
// source's node vanishes instead (its link cut to 100% loss as its agent
// goes on): TCP's keepalive and TCP_USER_TIMEOUT end the destination's
// wait within seconds, with the default 5-minute bound.
func TestSourceSilentBeforeFreeze(t *testing.T) {
	for _, tc := range []struct{ strategy, how string }{
		{"pre-copy", "stop"}, {"hybrid", "stop"}, {"hybrid", "partition"},
	} {
		strategy := tc.strategy
		t.Run(strategy+"/"+tc.how, func(t *testing.T) {
			f := newFaultBedIn(newEnvWith(t, failpointBinary), 10_000, 1000)
			// node1 waits for a silent source 3 s (its agent reads the
			// config as the supervisor restarts it).
			if tc.how == "stop" {
				setAgentConfig(f, "node1", "source_silence_ms", 3000)
			}
			fp := filepath.Join(f.node("node0").StateDir, "failpoint-source-stop-rounds")
			if err := os.WriteFile(fp, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			src := f.agentPID("node0")
			t.Cleanup(func() { _ = syscall.Kill(src, syscall.SIGCONT) })
			id := f.start(strategy)
			f.waitFor("the source agent's stop", func() bool {
				_, err := os.Stat(fp)
				return os.IsNotExist(err)
			})
			stopped := time.Now()
			link := f.node("node0").Link
			if tc.how == "partition" {
				cut := link
				cut.Loss = 1
				if err := testbed.SetLink(context.Background(), f.e.root, f.e.name, "node0", cut); err != nil {
					t.Fatalf("cut node0's link: %v", err)
				}
				if err := syscall.Kill(src, syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			}
			f.waitFor("the destination's giving up", func() bool { return f.phase("node1", id).Final() })
			t.Logf("the destination ended %s %s after the source went silent (%s)", f.phase("node1", id), time.Since(stopped).Round(time.Millisecond), tc.how)
			if p := f.phase("node1", id); p != migration.Aborted {
				t.Fatalf("the destination ended %s, want %s", p, migration.Aborted)
			}
			if tc.how == "partition" {
				if err := testbed.SetLink(context.Background(), f.e.root, f.e.name, "node0", link); err != nil {
					t.Fatalf("heal node0's link: %v", err)
				}
			} else if err := syscall.Kill(src, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if out := f.settle(id); out != migration.Aborted {
				t.Fatalf("the source ended %s, want aborted", out)
			}
			f.check("node0")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var res migResult
			err := f.client("node0").Migrate(ctx, "redis", api.MigrateRequest{To: "node1", Strategy: strategy,
				Compression: "off", LinkBps: 200_000_000}, &res)
			if err != nil || !res.OK {
				t.Fatalf("the next migration to node1: %+v, %v", res, err)
			}
			f.check("node1")
		})
	}
}

// setAgentConfig sets key to v in node's agent config and restarts its
// agent (the supervisor starts it again with the file).
func setAgentConfig(f *faultBed, node, key string, v any) {
	t := f.e.t
	t.Helper()
	cfgPath := filepath.Join(f.node(node).StateDir, "agent.json")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg[key] = v
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f.kill(node)
}

// TestKillSourceCommittedLazy kills -9 the source's agent once it has
// committed a post-copy or hybrid migration, while its lazy dump serves
// the destination's pages through it: the session breaks, so the
// destination's restore fails and hands the service back, or every page
// had crossed and the destination keeps it. Either way exactly one copy
// answers, with every key and its client's connection (the source's
// resumed sockets taken out of CRIU's repair mode).
func TestKillSourceCommittedLazy(t *testing.T) {
	for _, strategy := range []string{"post-copy", "hybrid"} {
		t.Run(strategy, func(t *testing.T) {
			f := newFaultBed(t)
			id := f.start(strategy)
			f.waitFor("committed", func() bool { return f.phase("node0", id) == migration.Committed })
			f.kill("node0")
			out := f.settle(id)
			want := "node0"
			if out == migration.Done {
				want = "node1"
			}
			t.Logf("killed node0's agent in its committed phase; the source ended %s", out)
			f.check(want)
		})
	}
}

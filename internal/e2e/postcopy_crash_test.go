package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

// runcHas reports whether the runc of the agent with state directory
// stateDir still knows container name (a lazy dump's container is there,
// frozen, until CRIU's page server ends its session).
func runcHas(stateDir, name string) bool {
	return exec.Command("runc", "--root", filepath.Join(stateDir, "runc"), "state", name).Run() == nil
}

// killAgentOf kills the agent of st's node i with SIGKILL and returns its
// pid.
func killAgentOf(t *testing.T, st *testbed.State, i int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(st.Nodes[i].StateDir, "agent.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s's agent %d: %v", st.Nodes[i].Name, pid, err)
	}
	return pid
}

// groupJobs starts moving group "app" from node0 to node1 with strategy
// and returns its jobs' ids by member.
func groupJobs(t *testing.T, st *testbed.State, strategy string) map[string]string {
	t.Helper()
	jobs, err := api.NewUnixClient(st.Nodes[0].Socket).StartGroupMigration(context.Background(), "app",
		api.MigrateRequest{To: "node1", Strategy: strategy})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, j := range jobs {
		ids[j.Container] = j.ID
	}
	if ids["db"] == "" || ids["web"] == "" {
		t.Fatalf("jobs %+v, want db and web", jobs)
	}
	return ids
}

// settleGroupOn waits until both members run on node (after a restart of
// agent pid old of node0, when old is not 0) and every job ended with
// phase want on node0.
func (e *env) settleGroupOn(st *testbed.State, jobs map[string]string, node string, want migration.Phase) {
	e.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var ps []ctr
		out, _, err := e.run("ps", "--json")
		if err == nil && json.Unmarshal([]byte(out), &ps) == nil && len(ps) == 2 &&
			ps[0].Node == node && ps[1].Node == node && ps[0].Status == "running" && ps[1].Status == "running" {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the group did not settle on %s: ps %s", node, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for name, id := range jobs {
		for {
			p := journalPhase(st.Nodes[0].StateDir, id)
			if p.Final() {
				e.t.Logf("%s: %s", name, p)
				if p != want {
					e.t.Errorf("%s's migration ended %s, want %s", name, p, want)
				}
				break
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("%s's migration never ended (at %s)", name, p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestGroupPostCopyLazySessionAwaitsCommit: a member of a post-copy group
// restored on the destination while another still dumps must keep its
// source copy until the group commits. CRIU's lazy page server kills the
// dumped tasks once its session ends with a CLOSE, and runc then destroys
// the container: a session ended before the commit leaves nothing to roll
// back to (the images lack their pages), so the source's crash then — or
// any failure of the other member — lost the service ("rollback failed,
// service lost: the images … are a lazy dump's, N runs of pages short").
// Here web's destination has restored it and fetched all its pages while
// db's dump is held up; web's container must still be on node0, and when
// node0's agent dies there the group rolls back whole.
func TestGroupPostCopyLazySessionAwaitsCommit(t *testing.T) {
	e := newEnv(t)
	slowDump := criuDumpWrapper(t, "db", "sleep 8")
	st := e.upWithRunc(map[string]string{"node0": slowDump})
	const n, size = 2_000, 1000
	db, web := e.redisGroup(st, n, size)
	link := replicaLinkID(t, db)
	jobs := groupJobs(t, st, "post-copy")
	deadline := time.Now().Add(2 * time.Minute)
	for journalPhase(st.Nodes[1].StateDir, jobs["web"]) != migration.Restored {
		if time.Now().After(deadline) || journalPhase(st.Nodes[0].StateDir, jobs["web"]).Final() {
			t.Fatalf("web never restored on node1 before the commit (source at %q)", journalPhase(st.Nodes[0].StateDir, jobs["web"]))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Its pages cross in well under this (a few MB, prefetched); db's
	// dump is held 8 s.
	time.Sleep(2 * time.Second)
	if p := journalPhase(st.Nodes[0].StateDir, jobs["db"]); p != migration.Frozen {
		t.Fatalf("db's source is at %q, want still frozen (dumping)", p)
	}
	if !runcHas(st.Nodes[0].StateDir, "web") {
		t.Fatal("web's source container is gone before its group committed: its lazy session ended early")
	}
	old := killAgentOf(t, st, 0)
	t.Logf("killed node0's agent (pid %d) with web restored on node1 and db still dumping", old)
	e.settleGroupOn(st, jobs, "node0", migration.RolledBack)
	e.checkGroupIntact("after node0's agent died before the group's commit", db, web, "node0", link, n, size, 1)
}

// TestKillDestinationDuringLazyPhase kills -9 the destination's agent
// while the pages of a post-copy or hybrid migration of redis holding 50
// MB still cross (the destination has committed). Its lazy-pages daemon
// and page proxy die with it, so the pages still on the source never
// arrive and the restored copy cannot be kept. The source's CRIU resumes
// the service's tasks when its page server's session fails; the
// restarted destination destroys its copy once the source says so, and
// the source takes the service back: exactly one copy runs, on node0,
// with all its data and the client's connection (idle since the freeze,
// so its sequence numbers still match the source's sockets). Only a lazy
// phase that ended before the kill leaves the service on node1. The kill
// comes as the destination journals its commit (the source may not have
// its word yet: it asks the destination's journal, ActAskDest), or once
// the source awaits the pages (it learns of the failure from its CRIU,
// ActCheckDest).
func TestKillDestinationDuringLazyPhase(t *testing.T) {
	for _, strategy := range []string{"post-copy", "hybrid"} {
		for _, when := range []string{"commit", "pages"} {
			t.Run(strategy+"/"+when, func(t *testing.T) {
				killDestinationDuringLazyPhase(t, strategy, when)
			})
		}
	}
}

func killDestinationDuringLazyPhase(t *testing.T, strategy, when string) {
	f := newFaultBedHolding(t, faultKeys, faultSize)
	id := f.start(strategy)
	f.waitFor("the destination's commit", func() bool {
		p := f.phase("node1", id)
		return p == migration.Committed || p.Final()
	})
	if when == "pages" {
		f.waitFor("the source awaiting the pages", func() bool {
			j, err := f.client("node0").Job(context.Background(), id)
			return f.phase("node1", id).Final() || err == nil && j.Progress != nil && j.Progress.Step == migration.ActAwaitLazy.String()
		})
	}
	if p := f.phase("node1", id); p != migration.Committed {
		t.Skipf("the lazy phase ended before the kill (destination at %s)", p)
	}
	f.kill("node1")
	out := f.settle(id)
	t.Logf("killed node1's agent in the lazy phase; the source ended %s, the destination %s", out, f.phase("node1", id))
	switch out {
	case migration.RolledBack:
		if p := f.phase("node1", id); p != migration.Aborted {
			t.Errorf("the destination ended %s, want %s", p, migration.Aborted)
		}
		f.check("node0")
		j, err := f.client("node0").Job(context.Background(), id)
		if err != nil || j.State != string(migration.OutcomeRolledBack) {
			t.Errorf("the source's job: %+v, %v; want %s", j, err, migration.OutcomeRolledBack)
		}
	case migration.Done:
		f.check("node1") // the lazy phase ended just before the kill
	default:
		t.Fatalf("the source ended %s, want rolled-back (or done, the pages all across before the kill)", out)
	}
}

// TestSourceCrashLazyDumpServing: the source agent exits (failpoint
// lazy-dump-serving) right after its lazy dump's page server came up, its
// runc and CRIU left waiting for a page client with the service's tasks
// seized. The runc outlives the agent; the restarted agent makes CRIU's
// page server fail, CRIU resumes the tasks, and the service runs on
// node0 with its data and its client's connection.
func TestSourceCrashLazyDumpServing(t *testing.T) {
	for _, strategy := range []string{"post-copy", "hybrid"} {
		t.Run(strategy, func(t *testing.T) {
			f := newFaultBedIn(newEnvWith(t, failpointBinary), 10_000, 1000)
			fp := filepath.Join(f.node("node0").StateDir, "failpoint-lazy-dump-serving")
			if err := os.WriteFile(fp, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			id := f.start(strategy)
			out := f.settle(id)
			if _, err := os.Stat(fp); err == nil {
				t.Fatal("the source agent never reached the failpoint")
			}
			if out != migration.RolledBack {
				t.Errorf("the source ended %s, want %s", out, migration.RolledBack)
			}
			f.check("node0")
		})
	}
}

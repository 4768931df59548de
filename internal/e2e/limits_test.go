package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/testbed"
)

// cgroupV1File reads file of process pid's cgroup v1 hierarchy of
// controller (the mount /sys/fs/cgroup/<controller>).
func cgroupV1File(t *testing.T, pid int, controller, file string) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), controller) {
			b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, parts[2], file))
			if err != nil {
				t.Fatalf("pid %d's %s cgroup: %v", pid, controller, err)
			}
			return strings.TrimSpace(string(b))
		}
	}
	t.Skipf("no cgroup v1 %s hierarchy on this host (pid %d)", controller, pid)
	return ""
}

type limitedCtr struct {
	ctr
	MemoryLimit int64   `json:"memory_limit"`
	PidsLimit   int64   `json:"pids_limit"`
	CPUs        float64 `json:"cpus"`
}

// TestLimitsFollowMigration: a container runs under the cgroup limits
// `run` gives it (memory, tasks, CPU quota), one without flags under the
// agent's defaults (2 GiB, 4096 tasks), and after a migration the
// service runs under the same limits on the destination: runc's restore
// applies the bundle's resources, and CRIU restores into a cgroup with a
// memory limit.
func TestLimitsFollowMigration(t *testing.T) {
	e := newEnv(t)
	st := e.upAPI(testbed.DefaultSpec(e.name, 2, 1), testbed.Options{})
	e.logsOnFailure(st)

	if _, errs, err := e.run("run", "--node", "node0", "--name", "tiny", "--image", "probe", "--memory", "1k", "--", "7000"); err == nil || !strings.Contains(errs, "memory") {
		t.Errorf("run --memory 1k: %v, %q; want the limit refused", err, errs)
	}
	var c limitedCtr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "lim", "--image", "probe", "--memory", "64m", "--pids", "100", "--cpus", "0.5", "--json", "--", "7000")
	var d limitedCtr
	e.mustJSON(&d, "run", "--node", "node0", "--name", "dflt", "--image", "probe", "--json", "--", "7001")
	check := func(where string, pid int, mem, pids, quota string) {
		t.Helper()
		if got := cgroupV1File(t, pid, "memory", "memory.limit_in_bytes"); got != mem {
			t.Errorf("%s: memory.limit_in_bytes %s, want %s", where, got, mem)
		}
		if got := cgroupV1File(t, pid, "pids", "pids.max"); got != pids {
			t.Errorf("%s: pids.max %s, want %s", where, got, pids)
		}
		if got := cgroupV1File(t, pid, "cpu", "cpu.cfs_quota_us"); got != quota {
			t.Errorf("%s: cpu.cfs_quota_us %s, want %s", where, got, quota)
		}
	}
	check("on node0", c.Pid, "67108864", "100", "50000")
	check("defaults on node0", d.Pid, fmt.Sprint(2<<30), "4096", "-1")
	if c.MemoryLimit != 64<<20 || c.PidsLimit != 100 || c.CPUs != 0.5 {
		t.Errorf("run --json: limits %d, %d, %v; want 64 MiB, 100, 0.5", c.MemoryLimit, c.PidsLimit, c.CPUs)
	}

	e.migrateOK("lim", "node1", "stop-and-copy")
	var ps []limitedCtr
	e.mustJSON(&ps, "ps", "--json")
	i := slices.IndexFunc(ps, func(p limitedCtr) bool { return p.Name == "lim" })
	if i < 0 || ps[i].Node != "node1" || ps[i].Pid <= 0 {
		t.Fatalf("ps after the migration: %+v", ps)
	}
	check("restored on node1", ps[i].Pid, "67108864", "100", "50000")
	if ps[i].MemoryLimit != 64<<20 || ps[i].PidsLimit != 100 || ps[i].CPUs != 0.5 {
		t.Errorf("ps on node1: limits %d, %d, %v; want 64 MiB, 100, 0.5", ps[i].MemoryLimit, ps[i].PidsLimit, ps[i].CPUs)
	}
}

// TestMigrationsCapped: three migrations started at once from one node
// (default cap: 2 at once per node) all end ok; the third waits queued,
// with a reason naming the cap, and starts once a slot is free: never
// do more than two run at the same time. Then three from two nodes to a
// third: the destination refuses the third for now, whose source waits
// queued and asks again, and it too ends ok.
func TestMigrationsCapped(t *testing.T) {
	e := newEnv(t)
	st := e.upAPI(testbed.DefaultSpec(e.name, 3, 1), testbed.Options{})
	e.logsOnFailure(st)
	for i, n := range []string{"q0", "q1", "q2", "r0"} {
		e.must("run", "--node", "node0", "--name", n, "--image", "probe", "--memory", "64m", "--", fmt.Sprint(7000+i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	node := func(i int) *api.Client { return api.NewUnixClient(st.Nodes[i].Socket) }

	// Three from node0 to node1: node0's cap queues the third.
	queued := migrateAtOnce(ctx, t, map[string]*api.Client{"q0": node(0), "q1": node(0), "q2": node(0)}, "node1")
	if len(queued) == 0 {
		t.Error("no migration was seen queued at node0's cap")
	}
	// Two from node1 and one from node0 to node2: node2's cap refuses
	// the third for now.
	queued = migrateAtOnce(ctx, t, map[string]*api.Client{"q0": node(1), "q1": node(1), "r0": node(0)}, "node2")
	if !slices.ContainsFunc(queued, func(why string) bool { return strings.Contains(why, "waiting for the destination") }) {
		t.Errorf("no migration was seen waiting for node2's cap: %q", queued)
	}
	if js, err := node(2).Jobs(ctx); err != nil {
		t.Fatal(err)
	} else if n := mostAtOnce(js); n > 2 {
		t.Errorf("node2 received %d migrations at once", n)
	}
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	for _, p := range ps {
		if p.Status != "running" || p.Node != map[string]string{"q0": "node2", "q1": "node2", "q2": "node1", "r0": "node2"}[p.Name] {
			t.Errorf("after the migrations: %+v", p)
		}
	}
}

// migrateAtOnce starts a stop-and-copy migration of each container to
// dest on its node's agent, all at once, and waits for them to end ok,
// never more than 2 running at once on a node; it returns the reasons
// the jobs were seen queued for.
func migrateAtOnce(ctx context.Context, t *testing.T, on map[string]*api.Client, dest string) []string {
	t.Helper()
	type started struct {
		c  *api.Client
		id string
	}
	var jobs []started
	for name, c := range on {
		j, err := c.StartMigration(ctx, name, api.MigrateRequest{To: dest, Strategy: "stop-and-copy"})
		if err != nil {
			t.Fatalf("start migration of %s: %v", name, err)
		}
		jobs = append(jobs, started{c, j.ID})
	}
	ended := map[string]api.Job{}
	byNode := map[string][]api.Job{}
	var queued []string
	for len(ended) < len(jobs) {
		if ctx.Err() != nil {
			t.Fatalf("migrations not ended: %d of %d", len(ended), len(jobs))
		}
		for _, s := range jobs {
			if _, ok := ended[s.id]; ok {
				continue
			}
			j, err := s.c.Job(ctx, s.id)
			if err != nil {
				t.Fatal(err)
			}
			switch j.State {
			case "queued":
				if !slices.Contains(queued, j.Reason) {
					t.Logf("%s queued: %s", j.Container, j.Reason)
					queued = append(queued, j.Reason)
				}
				if !strings.Contains(j.Reason, "at most 2 migrations") {
					t.Errorf("%s queued for %q, want the cap named", j.Container, j.Reason)
				}
			case "running":
			default:
				ended[s.id] = j
				byNode[j.Node] = append(byNode[j.Node], j)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, j := range ended {
		if j.State != "ok" {
			r, _ := j.MigrationResult()
			t.Errorf("%s ended %s: %s", j.Container, j.State, r.Error)
		}
		if j.Admitted.IsZero() || j.Ended.Before(j.Admitted) {
			t.Errorf("%s: admitted %v, ended %v", j.Container, j.Admitted, j.Ended)
		}
	}
	for n, js := range byNode {
		if most := mostAtOnce(js); most > 2 {
			t.Errorf("%s ran %d migrations at once", n, most)
		}
	}
	return queued
}

// mostAtOnce is the most jobs that ran at once (from their admission to
// their end).
func mostAtOnce(js []api.Job) int {
	most := 0
	for _, a := range js {
		if a.Admitted.IsZero() {
			continue
		}
		n := 0
		for _, b := range js {
			if !b.Admitted.IsZero() && !b.Admitted.After(a.Admitted) && (b.Ended.IsZero() || b.Ended.After(a.Admitted)) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

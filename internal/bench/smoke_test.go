package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// TestContinuitySmoke runs `edgehop bench continuity --runs 2 --json` end
// to end (its own testbed, real agents, runc, CRIU and podman) and checks
// the report's shape, that edgehop's probe connection survived without a
// reset or a lost byte, and that nothing of the testbed is left behind.
func TestContinuitySmoke(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc", "criu", "iptables", "nsenter")
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skip("podman is not installed: the benchmark's baseline needs it (scripts/setup.sh installs it)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "edgehop")
	for _, b := range []struct{ out, pkg string }{{bin, "../../cmd/edgehop"}, {filepath.Join(dir, "probe"), "../../cmd/probe"}} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "continuity", "--runs", "2", "--json", "--root", filepath.Join(dir, "root"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("edgehop bench continuity: %v\nstderr: %s\nstdout: %s", err, stderr.String(), stdout.String())
	}
	t.Logf("bench took %v", time.Since(start).Round(time.Millisecond))

	var raw map[string]json.RawMessage
	if err := json.Unmarshal(stdout.Bytes(), &raw); err != nil {
		t.Fatalf("output is not a JSON object: %v\n%s", err, stdout.String())
	}
	checkSideShape(t, "report", raw)
	var base map[string]json.RawMessage
	if err := json.Unmarshal(raw["baseline"], &base); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	checkSideShape(t, "baseline", base)
	if _, ok := raw["ratio"]; !ok {
		t.Error("report lacks ratio")
	}

	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("edgehop gap p50 %.1f ms downtime p50 %.1f ms; podman gap p50 %.1f ms downtime p50 %.1f ms %s; ratio %s",
		rep.GapMs.P50, rep.DowntimeMs.P50, rep.Baseline.GapMs.P50, rep.Baseline.DowntimeMs.P50, rep.Baseline.Reason, ratioText(rep.Ratio))
	if rep.Runs != 2 || rep.Failed != 0 {
		t.Errorf("edgehop: %d runs, %d failed; want 2 and 0", rep.Runs, rep.Failed)
	}
	if rep.Resets != 0 || rep.ConnErrors != 0 || rep.LostBytes != 0 || rep.Mismatches != 0 {
		t.Errorf("edgehop broke the probe connection: %d resets, %d errors, %d lost bytes, %d mismatches (%v)",
			rep.Resets, rep.ConnErrors, rep.LostBytes, rep.Mismatches, rep.Probe.Errors)
	}
	if rep.GapMs.P50 <= 0 || rep.DowntimeMs.P50 <= 0 || len(rep.PerRun) != 2 || rep.PerRun[0].From == rep.PerRun[0].To {
		t.Errorf("implausible edgehop figures: gap %+v downtime %+v runs %+v", rep.GapMs, rep.DowntimeMs, rep.PerRun)
	}
	if !rep.Baseline.Available {
		t.Errorf("podman is installed but the baseline was unavailable: %s", rep.Baseline.Reason)
	} else if rep.Baseline.Runs != 2 || rep.Ratio == nil || *rep.Ratio <= 0 {
		t.Errorf("baseline runs %d ratio %v; want 2 and a positive ratio", rep.Baseline.Runs, rep.Ratio)
	}

	// Nothing left behind: namespaces, podman containers, scratch.
	name := rep.Testbed.Name
	if name == "" {
		t.Fatal("report does not name its testbed")
	}
	if left, _ := filepath.Glob(linux.NetNSPath("eh-" + name + "-*")); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
	out, err := exec.Command("podman", "ps", "-a", "--format", "{{.Names}}").Output()
	if err != nil {
		t.Fatalf("podman ps: %v", err)
	}
	if strings.Contains(string(out), name) {
		t.Errorf("podman containers left behind:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", "edgehop-bench-"+name)); err == nil {
		t.Error("scratch directory left behind")
	}
}

// checkSideShape checks the fields the benchmark promises on a path.
func checkSideShape(t *testing.T, what string, m map[string]json.RawMessage) {
	t.Helper()
	for _, k := range []string{"runs", "resets", "lost_bytes", "phases_ms"} {
		if _, ok := m[k]; !ok {
			t.Errorf("%s lacks %q", what, k)
		}
	}
	for _, k := range []string{"gap_ms", "downtime_ms"} {
		var s map[string]float64
		if err := json.Unmarshal(m[k], &s); err != nil {
			t.Errorf("%s.%s is not an object of numbers: %v", what, k, err)
			continue
		}
		for _, q := range []string{"p50", "p99", "max"} {
			if _, ok := s[q]; !ok {
				t.Errorf("%s.%s lacks %q", what, k, q)
			}
		}
	}
}

// TestSoakSmoke runs `edgehop bench soak --migrations 12 --json`: every
// strategy migrates each of the three services, whose clients must see no
// reset, lost byte or lost or duplicated key.
func TestSoakSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc", "criu", "iptables", "nsenter")
	bin := edgehopBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "soak", "--migrations", "12", "--json", "--root", filepath.Join(t.TempDir(), "root"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep SoakReport
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("bench soak: %v (%v)\nstderr: %s\nstdout: %s", err, jerr, tail(stderr.String(), 2000), stdout.String())
	}
	t.Logf("soak: %d migrations, %d ok, %d resets, %d lost bytes, %d lost keys, ops %v, downtime %v",
		rep.Migrations, rep.OK, rep.Resets, rep.LostBytes, rep.LostKeys, rep.Ops, rep.Downtime)
	if err != nil {
		t.Fatalf("bench soak failed: %v: %v", err, rep.Errors)
	}
	if rep.Migrations != 12 || rep.OK != 12 || len(rep.Downtime) != 4 {
		t.Errorf("want 12 successful migrations over 4 strategies: %+v", rep)
	}
	for svc, n := range rep.Ops {
		if n < 10 {
			t.Errorf("%s's client made %d operations: the soak did not load it", svc, n)
		}
	}
}

// TestSoakChaosSmoke runs `edgehop bench soak --chaos --migrations 4`: the
// source's agent killed, the destination's, a link cut, the destination's
// again (seed 1's plan), each migration settled with its service running on
// exactly one node, the one its source's outcome names.
func TestSoakChaosSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc", "criu", "iptables", "nsenter")
	bin := edgehopBin(t)
	// The agent runs CRIU through its shim beside its binary: a binary
	// built here gets the shim of bin/ (make builds it).
	for _, f := range []string{"edgehop-criu", "edgehop-criu-gate.so"} {
		if b, err := os.ReadFile(filepath.Join("../../bin", f)); err == nil && os.Getenv("EDGEHOP_BIN") == "" {
			_ = os.WriteFile(filepath.Join(filepath.Dir(bin), f), b, 0o755)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, "bench", "soak", "--chaos", "--seed", "1", "--migrations", "4", "--json",
		"--root", filepath.Join(dir, "root"), "--cases", filepath.Join(dir, "cases"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep SoakReport
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil || rep.Chaos == nil {
		t.Fatalf("bench soak --chaos: %v (%v)\nstderr: %s\nstdout: %s", err, jerr, tail(stderr.String(), 2000), stdout.String())
	}
	c := rep.Chaos
	t.Logf("chaos: %d migrations, outcomes %v, kills %v, %d cuts, longest settle %.0f ms, resets %d, lost keys %d",
		rep.Migrations, c.Outcomes, c.KillsPhase, c.LinkCuts, c.LongestSettle, rep.Resets, rep.LostKeys)
	if rep.Migrations != 4 || c.Kills != 3 || c.LinkCuts != 1 || len(c.PerMigration) != 4 {
		t.Errorf("want 4 migrations, 3 kills and 1 cut: %+v", c)
	}
	if err != nil || c.Failures() != 0 {
		t.Errorf("bench soak --chaos failed (%v): %d lost, %d duplicated, %d misplaced; %v", err, c.ServicesLost, c.Duplicated, c.Misplaced, rep.Errors)
	}
}

// TestPersistenceSmoke runs `edgehop bench persistence --sizes 8 --json`:
// a Redis holding 8 MB moved with stop-and-copy and post-copy (its client's
// connection kept) and with Redis's own save/copy/restart/load, every
// destination's data identical to the source's, and nothing left behind.
func TestPersistenceSmoke(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc", "criu", "iptables", "nsenter")
	bin := edgehopBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "persistence", "--sizes", "8", "--json", "--root", filepath.Join(t.TempDir(), "root"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench persistence: %v\nstderr: %s\nstdout: %s", err, tail(stderr.String(), 2000), stdout.String())
	}
	var rep PersistenceReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("output: %v\n%s", err, stdout.String())
	}
	methods := map[string]PersistenceRow{}
	for _, r := range rep.Rows {
		t.Logf("%s: downtime %.1f ms (engine %.1f), %d keys, %d bytes of state, ok=%v %s", r.Method, r.DowntimeMs, r.EngineDowntimeMs, r.Keys, r.StateBytes, r.OK, r.Error)
		methods[r.Method] = r
		if !r.OK || !r.DataVerified || r.DowntimeMs <= 0 || r.Keys != 8000 || r.SizeMB != 8 {
			t.Errorf("%s: ok=%v data verified=%v downtime %.1f ms keys %d: %s", r.Method, r.OK, r.DataVerified, r.DowntimeMs, r.Keys, r.Error)
		}
	}
	for _, m := range []string{"edgehop stop-and-copy", "edgehop post-copy"} {
		r, ok := methods[m]
		switch {
		case !ok:
			t.Errorf("no %s row", m)
		case !r.ConnectionKept || r.DowntimeVsPersistence == nil || r.EngineDowntimeMs <= 0:
			t.Errorf("%s: connection kept %v, ratio %v, engine downtime %.1f", m, r.ConnectionKept, r.DowntimeVsPersistence, r.EngineDowntimeMs)
		}
	}
	if r, ok := methods[PersistenceMethod]; !ok || r.StateBytes < 8e6 {
		t.Errorf("persistence row %+v: want an RDB of at least the 8 MB of values", r)
	}
	if len(rep.Goals) != 2 {
		t.Errorf("%d goals, want one per live method", len(rep.Goals))
	}
	if left, _ := filepath.Glob(linux.NetNSPath("eh-" + rep.Testbed.Name + "-*")); rep.Testbed.Name == "" || len(left) > 0 {
		t.Errorf("testbed %q: namespaces left behind: %v", rep.Testbed.Name, left)
	}
}

// edgehopBin is $EDGEHOP_BIN, else an edgehop built for the test.
func edgehopBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("EDGEHOP_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "edgehop")
	cmd := exec.Command("go", "build", "-o", bin, "../../cmd/edgehop")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build edgehop: %v\n%s", err, out)
	}
	return bin
}

// TestCloudhopperSmoke runs `edgehop bench cloudhopper` idle and at 10
// clients with short load windows: WordPress and MariaDB (a database
// holding file locks, a web tier of many processes opening a database
// connection per request) migrate as one group under wrk's writes with no
// failed or non-2xx request and every acknowledged write stored.
func TestCloudhopperSmoke(t *testing.T) {
	stdout := runCloudhopper(t, "--clients", "0,10")
	var raw struct {
		Runs []map[string]json.RawMessage `json:"runs"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &raw); err != nil || len(raw.Runs) != 2 {
		t.Fatalf("output (%v): %s", err, stdout.String())
	}
	for _, k := range []string{"clients", "downtime_ms", "total_ms", "failed_requests", "non_2xx", "max_latency_ms"} {
		if _, ok := raw.Runs[0][k]; !ok {
			t.Errorf("runs have no %q", k)
		}
	}
	var rep CloudhopperReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	for i, r := range rep.Runs {
		t.Logf("%d clients: downtime %.1f ms, total %.1f ms, %d requests (%d failed, %d not 2xx), slowest %.1f ms, probe %.1f ms, writes %d/%d, %d bytes",
			r.Clients, r.DowntimeMs, r.TotalMs, r.Requests, r.FailedRequests, r.NonOK, r.MaxLatencyMs, r.ProbeMaxMs, r.WritesStored, r.WritesAcked, r.BytesOnWire)
		want := []int{0, 10}[i]
		if r.Clients != want || !r.OK || len(r.Members) != 2 || r.DowntimeMs <= 0 || r.TotalMs < r.DowntimeMs || r.BytesOnWire <= 0 ||
			r.FailedRequests != 0 || r.NonOK != 0 || r.ProbeErrors != 0 || r.ProbeRequests == 0 || !r.DataOK {
			t.Errorf("run %d: %+v", i, r)
		}
		if want > 0 && (r.Requests == 0 || r.WritesAcked == 0 || r.WrkMaxLatencyMs <= 0 || r.MaxLatencyMs < r.ProbeMaxMs) {
			t.Errorf("%d clients: %d requests, %d writes acknowledged, slowest %.1f ms (wrk %.1f, probe %.1f): the load did not run", want, r.Requests, r.WritesAcked, r.MaxLatencyMs, r.WrkMaxLatencyMs, r.ProbeMaxMs)
		}
	}
	if rep.Runs[0].From == rep.Runs[1].From {
		t.Errorf("both runs migrated from %s: the group did not move", rep.Runs[0].From)
	}
	if left, _ := filepath.Glob(linux.NetNSPath("eh-" + rep.Testbed.Name + "-*")); rep.Testbed.Name == "" || len(left) > 0 {
		t.Errorf("testbed %q: namespaces left behind: %v", rep.Testbed.Name, left)
	}
}

// TestCloudhopperPostCopySmoke: the WordPress group moves with post-copy,
// the probe reading through PHP and MariaDB every 100 ms without an error.
// MariaDB's lazy dump used to fail (CRIU allocated an iovec per page of
// the 8 TiB MariaDB reserves for its buffer pool; the image now caps the
// reservation). Idle only: under load, requests wait for pages faulted
// across the 30 ms path for up to 25 s, and WordPress may answer one with
// an error (bench cloudhopper measures that).
func TestCloudhopperPostCopySmoke(t *testing.T) {
	stdout := runCloudhopper(t, "--strategy", "post-copy", "--clients", "0")
	var rep CloudhopperReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || len(rep.Runs) != 1 {
		t.Fatalf("output (%v): %s", err, stdout.String())
	}
	r := rep.Runs[0]
	t.Logf("post-copy, idle: downtime %.1f ms, total %.1f ms, probe %d requests, slowest %.1f ms",
		r.DowntimeMs, r.TotalMs, r.ProbeRequests, r.MaxLatencyMs)
	if !r.OK || len(r.Members) != 2 || r.ProbeErrors != 0 || r.ProbeRequests == 0 || !r.DataOK {
		t.Errorf("post-copy run: %+v", r)
	}
}

// runCloudhopper runs `edgehop bench cloudhopper --json` with args (and a
// short warm-up and tail) and returns its output.
func runCloudhopper(t *testing.T, args ...string) *bytes.Buffer {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc", "criu", "iptables", "nsenter", "wrk")
	bin := edgehopBin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	args = append(append([]string{"bench", "cloudhopper"}, args...), "--warmup", "3s", "--tail", "2s", "--json",
		"--root", filepath.Join(t.TempDir(), "root"))
	cmd := exec.CommandContext(ctx, bin, args...)
	logs := keepLogs(t)
	cmd.Env = append(os.Environ(), KeepLogsEnv+"="+logs)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("edgehop %s: %v\nstderr: %s\nstdout: %s", strings.Join(args, " "), err, tail(stderr.String(), 2000), stdout.String())
	}
	return &stdout
}

// keepLogs is a directory for a benchmark's testbed logs (KeepLogsEnv);
// when the test fails, it prints the warnings and errors they hold.
func keepLogs(t *testing.T) string {
	dir := t.TempDir()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*", "*.log"))
		more, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*.log"))
		for _, f := range append(files, more...) {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			var lines []string
			for l := range strings.Lines(string(b)) {
				if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
					lines = append(lines, l)
				}
			}
			if len(lines) > 0 {
				rel, _ := filepath.Rel(dir, f)
				t.Logf("%s, warnings and errors:\n%s", rel, tail(strings.Join(lines, ""), 6000))
			}
		}
	})
	return dir
}

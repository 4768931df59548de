package runc_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

// advancing fails the test unless the counter in b goes on counting (the
// container runs and is not frozen).
func advancing(t *testing.T, b *syncBuffer, what string) {
	t.Helper()
	n := len(b.ints(t))
	t.Logf("%s: %d lines, waiting for 3 more", what, n)
	waitCount(t, b, n+3)
}

// TestGatedCheckpoint: a checkpoint with a gate waits, with runc started
// and CRIU not yet let in, while the container runs on; called off, it
// fails and leaves the container running; opened, it dumps, and the
// container restores and counts on (the shim also answers runc's version
// probe on both). With the gate library next to the shim, CRIU itself has
// started and waits at the gate; without, it starts when the gate opens.
func TestGatedCheckpoint(t *testing.T) {
	shim := runc.BuildShimForTest(t)
	if _, err := os.Stat(filepath.Join(filepath.Dir(shim), runc.GateLibName)); err != nil {
		t.Fatalf("the shim's gate library: %v", err)
	}
	alone := filepath.Join(t.TempDir(), runc.ShimName)
	if b, err := exec.Command("cp", shim, alone).CombinedOutput(); err != nil {
		t.Fatalf("copy the shim: %v %s", err, b)
	}
	t.Run("criu started at the gate", func(t *testing.T) { testGatedCheckpoint(t, shim, true) })
	t.Run("criu started after the gate", func(t *testing.T) { testGatedCheckpoint(t, alone, false) })
}

func testGatedCheckpoint(t *testing.T, shim string, criuEarly bool) {
	ctx := context.Background()
	r := newRuntime(t)
	r.Shim = shim
	requireCRIU(t, r)
	criu, err := exec.LookPath("criu")
	if err != nil {
		t.Fatal(err)
	}
	if criu, err = filepath.EvalSymlinks(criu); err != nil {
		t.Fatal(err)
	}
	id, spec, out := runCounter(t, r, "gate")
	images := filepath.Join(t.TempDir(), "images")

	// Ready comes once CRIU has written the images (its last, stats-dump,
	// is there).
	var ready atomic.Int32
	onReady := func() {
		if _, err := os.Stat(filepath.Join(images, "stats-dump")); err == nil {
			ready.Store(1)
		} else {
			ready.Store(2)
		}
	}
	gated := func(ctx context.Context) (*runc.Gate, chan error) {
		return checkpointAtGate(ctx, t, r, id, runc.CheckpointOpts{ImagePath: images, Ready: onReady}, 30*time.Second)
	}

	// Called off at the gate.
	cctx, cancel := context.WithCancel(ctx)
	_, done := gated(cctx)
	advancing(t, out, "at the gate")
	if got := criuOf(t, criu, id); (got != 0) != criuEarly {
		t.Fatalf("at the gate: criu process %d; want one: %v", got, criuEarly)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("checkpoint called off at its gate succeeded")
	}
	if ready.Load() != 0 {
		t.Error("a checkpoint called off said its images were ready")
	}
	if st, err := r.State(ctx, id); err != nil || st.Status != runc.StatusRunning {
		t.Fatalf("after the called-off checkpoint: state %+v, %v; want running", st, err)
	}
	if pid := criuOf(t, criu, id); pid != 0 {
		t.Fatalf("criu %d still there after the checkpoint was called off", pid)
	}
	advancing(t, out, "after the called-off checkpoint")

	// runc killed at the gate (not by Checkpoint's context): Checkpoint
	// returns, the container untouched.
	_, done = gated(ctx)
	out2, err := exec.Command("pkill", "-KILL", "-f", "runc .*checkpoint .*"+id).CombinedOutput()
	if err != nil {
		t.Fatalf("pkill runc: %v %s", err, out2)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("checkpoint whose runc was killed succeeded")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("checkpoint still running 20 s after its runc was killed at the gate")
	}
	advancing(t, out, "after runc was killed at the gate")

	// Opened.
	g, done := gated(ctx)
	advancing(t, out, "at the gate")
	if criuEarly {
		// CRIU read the request and prepared, and waits before it
		// seizes a task: nothing traces the service yet.
		if log, err := os.ReadFile(filepath.Join(images, "dump.log")); err != nil || !strings.Contains(string(log), "Dumping processes") {
			t.Errorf("at the gate: CRIU's log %q, %v; want it prepared to dump (\"Dumping processes\")", tail(string(log), 300), err)
		}
		st, err := r.State(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tracer := tracerOf(t, st.Pid); tracer != 0 {
			t.Errorf("at the gate: the service (pid %d) is traced by %d", st.Pid, tracer)
		}
	}
	g.Open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := ready.Load(); got != 1 {
		t.Errorf("ready: %d, want 1 (called, with stats-dump written)", got)
	}
	last := out.ints(t)
	if _, err := os.Stat(filepath.Join(images, "inventory.img")); err != nil {
		t.Fatalf("no images: %v", err)
	}
	spec.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
	var after syncBuffer
	if _, err := r.Restore(ctx, id, writeBundle(t, spec), runc.RestoreOpts{ImagePath: images}, runc.IO{Stdout: &after, Stderr: &after}); err != nil {
		t.Fatal(err)
	}
	consecutive(t, "after restore", waitCount(t, &after, 3), last[len(last)-1]+1)
	if err := r.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
}

// TestGateWithoutShim: on a Runtime without the shim a gate still holds
// the dump back (runc itself starts only when it opens), and opened, the
// checkpoint dumps.
func TestGateWithoutShim(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	id, _, out := runCounter(t, r, "gateo")
	images := filepath.Join(t.TempDir(), "images")
	g, done := checkpointAtGate(ctx, t, r, id, runc.CheckpointOpts{ImagePath: images}, 10*time.Second)
	advancing(t, out, "at the gate")
	g.Open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(images, "inventory.img")); err != nil {
		t.Fatalf("no images: %v", err)
	}
}

// tracerOf returns the pid tracing process pid (TracerPid), 0 if none.
func tracerOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("pid %d: %q", pid, l)
			}
			return n
		}
	}
	t.Fatalf("pid %d: no TracerPid", pid)
	return 0
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// criuOf returns the pid of a criu process (its executable criu) whose
// parent is a runc command about id, 0 if none.
func criuOf(t *testing.T, criu, id string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != criu {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + f[1] + "/cmdline")
		if bytes.Contains(cmdline, []byte("runc")) && bytes.Contains(cmdline, []byte(id)) {
			return pid
		}
	}
	return 0
}

// runCounter runs a counter container named after prefix in a namespace
// of its own and returns its id, spec and output once it has counted to 3.
func runCounter(t *testing.T, r *runc.Runtime, prefix string) (string, runc.Spec, *syncBuffer) {
	t.Helper()
	id := testutil.UniqueName(prefix)
	spec := testSpec(t, testutil.NewNetNS(t, prefix), counterArgs...)
	out := &syncBuffer{}
	if _, err := r.Run(context.Background(), id, writeBundle(t, spec), runc.IO{Stdout: out, Stderr: out}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, out, 3)
	return id, spec, out
}

// checkpointAtGate starts checkpointing id with o and a new gate, and
// returns the gate and the checkpoint's outcome to come once the gate is
// ready, within wait.
func checkpointAtGate(ctx context.Context, t *testing.T, r *runc.Runtime, id string, o runc.CheckpointOpts, wait time.Duration) (*runc.Gate, chan error) {
	t.Helper()
	o.Gate = runc.NewGate()
	done := make(chan error, 1)
	go func() { done <- r.Checkpoint(ctx, id, o) }()
	select {
	case <-o.Gate.Ready():
	case err := <-done:
		t.Fatalf("checkpoint ended before its gate: %v", err)
	case <-time.After(wait):
		t.Fatalf("no checkpoint at the gate after %s", wait)
	}
	return o.Gate, done
}

// TestGatedRestore: a restore with a gate starts runc with only
// descriptors.json in its image directory and waits, CRIU not yet run;
// called off, it fails and leaves nothing; opened once the other images
// are there, it restores and the counter goes on. A gate whose prepare
// step (criuimg's rewrite of the images) fails calls CRIU off with that
// failure.
func TestGatedRestore(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	r.Shim = runc.BuildShimForTest(t)
	requireCRIU(t, r)
	id, spec, out := runCounter(t, r, "grst")
	images := filepath.Join(t.TempDir(), "images")
	if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images}); err != nil {
		t.Fatal(err)
	}
	last := out.ints(t)
	spec.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
	bundle := writeBundle(t, spec)

	// restoreAtGate starts a gated restore from a directory holding only
	// descriptors.json, as a destination has it before the images arrive.
	type result struct {
		pid int
		err error
	}
	restoreAtGate := func(ctx context.Context, after *syncBuffer, cgroups []runc.CgroupDir, resumed func()) (string, *runc.Gate, chan result) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "in")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", filepath.Join(images, "descriptors.json"), dir).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		g := runc.NewGate()
		done := make(chan result, 1)
		go func() {
			pid, err := r.Restore(ctx, id, bundle, runc.RestoreOpts{ImagePath: dir, WorkPath: dir + "-work", Gate: g, Cgroups: cgroups, Resumed: resumed},
				runc.IO{Stdout: after, Stderr: after})
			done <- result{pid, err}
		}()
		select {
		case <-g.Ready():
		case res := <-done:
			t.Fatalf("restore ended before its gate: %v", res.err)
		case <-time.After(30 * time.Second):
			t.Fatal("no restore at the gate after 30 s")
		}
		return dir, g, done
	}

	// Called off at the gate.
	cctx, cancel := context.WithCancel(ctx)
	var after syncBuffer
	resumed := make(chan struct{}, 3)
	onResumed := func() { resumed <- struct{}{} }
	_, _, done := restoreAtGate(cctx, &after, nil, onResumed)
	if _, err := r.State(ctx, id); err == nil {
		// runc registers the container only once CRIU restored it.
		t.Log("runc lists the container while CRIU waits at the gate")
	}
	cancel()
	if res := <-done; res.err == nil {
		t.Fatal("restore called off at its gate succeeded")
	}
	assertGone(t, r, id, "", spec.CgroupsPath)

	// Opened with a core image that cannot be read (a directory): CRIU
	// is called off with the rewrite's reason.
	var after2 syncBuffer
	dir, g, done := restoreAtGate(ctx, &after2, nil, onResumed)
	if err := os.Mkdir(filepath.Join(dir, "core-1.img"), 0o700); err != nil {
		t.Fatal(err)
	}
	g.Open()
	err := (<-done).err
	t.Logf("restore whose images could not be prepared: %v", err)
	if err == nil || !strings.Contains(err.Error(), "core-1.img") {
		t.Errorf("restore with an unreadable core image: %v, want the rewrite's failure", err)
	}
	assertGone(t, r, id, "", spec.CgroupsPath)
	if len(resumed) > 0 {
		t.Fatal("a restore that failed said CRIU resumed its tasks")
	}

	// Opened once the images are there; runc started in the container's
	// cgroups, whose CPU share is low until the gate opens.
	var cgroups []runc.CgroupDir
	shares := ""
	v1, err := runc.LoadCgroupV1()
	if err != nil {
		t.Fatal(err)
	}
	if v1 != nil {
		if err := v1.Make(spec.CgroupsPath); err != nil {
			t.Fatal(err)
		}
		cgroups = v1.Dirs(spec.CgroupsPath)
		for _, d := range cgroups {
			if b, err := os.ReadFile(filepath.Join(d.Dir(), "cpu.shares")); err == nil {
				shares = filepath.Join(d.Dir(), "cpu.shares")
				t.Logf("%s: %s", shares, strings.TrimSpace(string(b)))
			}
		}
	}
	var after3 syncBuffer
	dir, g, done = restoreAtGate(ctx, &after3, cgroups, onResumed)
	// CRIU read the request and waits before its first image.
	if log, err := os.ReadFile(filepath.Join(dir+"-work", "restore.log")); err != nil || !strings.Contains(string(log), "Version:") {
		t.Errorf("at the gate: CRIU's log %q, %v; want it started on the request", tail(string(log), 300), err)
	}
	if shares != "" {
		if b, err := os.ReadFile(shares); err != nil || strings.TrimSpace(string(b)) != "110" {
			t.Errorf("at the gate, %s = %q (%v), want 110", shares, b, err)
		}
	}
	entries, err := os.ReadDir(images)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if out, err := exec.Command("cp", "-a", filepath.Join(images, e.Name()), dir).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}
	// Resumed comes once CRIU resumed the tasks, before runc is done;
	// the pid is the one runc records.
	g.Open()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if len(resumed) != 1 {
		t.Errorf("a restore that succeeded said %d times that CRIU resumed its tasks, want once", len(resumed))
	}
	if st, err := r.State(ctx, id); err != nil || st.Pid != res.pid || st.Status != "running" {
		t.Errorf("restored pid %d; runc state %+v, %v", res.pid, st, err)
	}
	consecutive(t, "after the gated restore", waitCount(t, &after3, 3), last[len(last)-1]+1)
	if shares != "" {
		if b, err := os.ReadFile(shares); err != nil || strings.TrimSpace(string(b)) != "1024" {
			t.Errorf("restored, %s = %q (%v), want 1024 again", shares, b, err)
		}
	}
	if err := r.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointMixedUsers: a container whose counting root shell runs a
// child as nobody (a root master with an unprivileged worker). Where root
// lacks CAP_SYS_RESOURCE, stock CRIU cannot read the child's rlimits;
// with the shim's gate library preloaded, CRIU reads them from
// /proc/PID/limits, the checkpoint succeeds, and the restored container
// counts on with its child still nobody. Without the library (the shim
// alone) the same checkpoint fails on the rlimits and the container
// keeps running.
func TestCheckpointMixedUsers(t *testing.T) {
	if ok, err := linux.HasCapSysResource(); err != nil || ok {
		t.Skipf("skipped: root holds CAP_SYS_RESOURCE here (%v), so CRIU reads every process's rlimits itself", err)
	}
	shim := runc.BuildShimForTest(t)
	alone := filepath.Join(t.TempDir(), runc.ShimName)
	if b, err := exec.Command("cp", shim, alone).CombinedOutput(); err != nil {
		t.Fatalf("copy the shim: %v %s", err, b)
	}
	ctx := context.Background()
	args := []string{"sh", "-c", "su -s /bin/sh nobody -c 'exec sleep 1000' & " + counterArgs[2]}
	run := func(t *testing.T, r *runc.Runtime) (string, runc.Spec, *syncBuffer, int) {
		id := testutil.UniqueName("mixed")
		spec := testSpec(t, testutil.NewNetNS(t, "mixed"), args...)
		out := &syncBuffer{}
		pid, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{Stdout: out, Stderr: out})
		if err != nil {
			t.Fatal(err)
		}
		waitCount(t, out, 3)
		return id, spec, out, pid
	}
	nobodyChild := func(t *testing.T, pid int) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() error {
			kids, err := linux.ProcessTree(pid)
			if err != nil {
				return err
			}
			for _, k := range kids {
				if u, err := linux.ProcessUIDs(k); err == nil && u == [3]int{65534, 65534, 65534} {
					return nil
				}
			}
			return fmt.Errorf("no process of %d runs as nobody (tree %v)", pid, kids)
		})
	}

	t.Run("library", func(t *testing.T) {
		r := newRuntime(t)
		r.Shim = shim
		requireCRIU(t, r)
		if !r.ReadsAnyRlimits(ctx) {
			t.Fatal("the gate library does not read rlimits from /proc here")
		}
		id, spec, out, pid := run(t, r)
		nobodyChild(t, pid)
		images := filepath.Join(t.TempDir(), "images")
		if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images}); err != nil {
			t.Fatalf("checkpoint of a root shell with a nobody child: %v", err)
		}
		last := out.ints(t)
		var after syncBuffer
		pid, err := r.Restore(ctx, id, writeBundle(t, spec), runc.RestoreOpts{ImagePath: images}, runc.IO{Stdout: &after, Stderr: &after})
		if err != nil {
			t.Fatal(err)
		}
		consecutive(t, "after restore", waitCount(t, &after, 3), last[len(last)-1]+1)
		nobodyChild(t, pid)
	})
	t.Run("shim alone", func(t *testing.T) {
		r := newRuntime(t)
		r.Shim = alone
		requireCRIU(t, r)
		if r.ReadsAnyRlimits(ctx) {
			t.Fatal("without the library, ReadsAnyRlimits says CRIU reads every rlimit")
		}
		id, _, out, pid := run(t, r)
		nobodyChild(t, pid)
		images := filepath.Join(t.TempDir(), "images")
		err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images})
		if err == nil {
			t.Fatal("stock CRIU dumped a nobody child without CAP_SYS_RESOURCE: the test shows nothing")
		}
		t.Logf("refused as expected: %v", err)
		if log, rerr := os.ReadFile(filepath.Join(images, runc.DumpLog)); rerr == nil && !strings.Contains(string(log), "rlimit") {
			t.Errorf("the dump failed, but not on rlimits: %v", err)
		}
		advancing(t, out, "after the failed checkpoint")
	})
}

// TestCRIULogLevel: with Runtime.CRIULogLevel, the gate library makes
// CRIU log a dump and a restore at that level instead of runc's 4, and
// the request it rewrote is otherwise intact (the container restores and
// counts on). Without it CRIU logs every step.
func TestCRIULogLevel(t *testing.T) {
	shim := runc.BuildShimForTest(t)
	ctx := context.Background()
	logs := map[int][2]string{}
	for _, level := range []int{0, 2} {
		r := newRuntime(t)
		r.Shim, r.CRIULogLevel = shim, level
		requireCRIU(t, r)
		id, spec, out := runCounter(t, r, "loglvl")
		images, work := filepath.Join(t.TempDir(), "images"), filepath.Join(t.TempDir(), "work")
		if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images, WorkPath: work}); err != nil {
			t.Fatalf("level %d: %v", level, err)
		}
		last := out.ints(t)
		spec.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
		after := &syncBuffer{}
		if _, err := r.Restore(ctx, id, writeBundle(t, spec), runc.RestoreOpts{ImagePath: images, WorkPath: work}, runc.IO{Stdout: after, Stderr: after}); err != nil {
			t.Fatalf("level %d: restore: %v", level, err)
		}
		waitCount(t, after, 3)
		if got := after.ints(t); len(last) == 0 || got[0] != last[len(last)-1]+1 {
			t.Errorf("level %d: counted %v after the restore, %v before", level, got, last)
		}
		var pair [2]string
		for i, name := range []string{runc.DumpLog, runc.RestoreLog} {
			b, err := os.ReadFile(filepath.Join(work, name))
			if err != nil {
				t.Fatal(err)
			}
			pair[i] = string(b)
		}
		logs[level] = pair
		t.Logf("level %d: dump.log %d bytes, restore.log %d bytes", level, len(pair[0]), len(pair[1]))
	}
	for i, name := range []string{runc.DumpLog, runc.RestoreLog} {
		full, quiet := logs[0][i], logs[2][i]
		// "Running" opens both operations' debug output: runc's level
		// has it, level 2 (errors and warnings) not.
		if !strings.Contains(full, "Running ") {
			t.Errorf("%s at runc's level lacks CRIU's debug lines:\n%s", name, full)
		}
		if strings.Contains(quiet, "Running ") || len(quiet)*10 > len(full) {
			t.Errorf("%s at level 2: %d bytes (at runc's level %d), debug lines kept:\n%s", name, len(quiet), len(full), quiet)
		}
	}
}

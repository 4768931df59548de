package runc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// counterArgs prints 1, 2, 3, ... every 50 ms.
var counterArgs = []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done"}

// waitCount waits until b holds at least n numbers and returns them.
func waitCount(t *testing.T, b *syncBuffer, n int) []int {
	t.Helper()
	var got []int
	testutil.Eventually(t, 10*time.Second, func() error {
		if got = b.ints(t); len(got) < n {
			return fmt.Errorf("%d lines so far, want %d", len(got), n)
		}
		return nil
	})
	return got
}

// consecutive fails the test unless nums counts up by one from first.
func consecutive(t *testing.T, what string, nums []int, first int) {
	t.Helper()
	for i, n := range nums {
		if n != first+i {
			t.Fatalf("%s: line %d is %d, want %d (all: %v)", what, i, n, first+i, nums)
		}
	}
}

// TestCheckpointRestore checkpoints a counting shell loop, checks the
// container is gone, restores it under the same id into a different
// network namespace, and sees the count continue exactly where the
// checkpoint stopped it. Dump and restore statistics must be plausible.
func TestCheckpointRestore(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	nsA := testutil.NewNetNS(t, "rcpa")
	nsB := testutil.NewNetNS(t, "rcpb")
	id := testutil.UniqueName("cnt")
	specA := testSpec(t, nsA, counterArgs...)
	var before syncBuffer
	pid, err := r.Run(ctx, id, writeBundle(t, specA), runc.IO{Stdout: &before, Stderr: &before})
	if err != nil {
		t.Fatal(err)
	}
	waitCount(t, &before, 10)

	images := filepath.Join(t.TempDir(), "images")
	work := filepath.Join(t.TempDir(), "work")
	start := time.Now()
	err = r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images, WorkPath: work})
	dumpWall := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	// The container is gone, and Checkpoint has drained its output.
	if alive(pid) {
		t.Errorf("pid %d alive after checkpoint", pid)
	}
	assertGone(t, r, id, nsA, specA.CgroupsPath)
	counted := before.ints(t)
	consecutive(t, "before checkpoint", counted, 1)
	last := counted[len(counted)-1]
	if _, err := os.Stat(filepath.Join(work, runc.DumpLog)); err != nil {
		t.Errorf("no CRIU dump log in the work dir: %v", err)
	}

	specB := specA
	specB.NetNSPath = nsB
	specB.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
	bundleB := writeBundle(t, specB)
	var after syncBuffer
	start = time.Now()
	pid, err = r.Restore(ctx, id, bundleB, runc.RestoreOpts{ImagePath: images, WorkPath: work},
		runc.IO{Stdout: &after, Stderr: &after})
	restoreWall := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.State(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if s.Status != runc.StatusRunning || s.Pid != pid || s.Bundle != bundleB {
		t.Errorf("restored state %+v, want running pid %d bundle %s", s, pid, bundleB)
	}
	wantNS, err := linux.NetNSInode(nsB)
	if err != nil {
		t.Fatal(err)
	}
	if got := netnsOf(t, pid); got != wantNS {
		t.Errorf("restored container in netns inode %d, want %d (%s)", got, wantNS, nsB)
	}
	consecutive(t, "after restore", waitCount(t, &after, 5), last+1)

	ds, err := runc.ReadDumpStats(work)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := runc.ReadRestoreStats(work)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := runc.ReadMemoryStats(images)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("images: %d processes, %d pages, %d bytes", ms.Processes, ms.Pages, ms.ImageBytes)
	if ms.Processes < 2 || ms.LazyPages != 0 || ms.PresentPages != ds.PagesWritten || ms.Pages != ds.PagesWritten {
		t.Errorf("memory stats %+v: want the shell and its sleep, no lazy pages, %d pages as CRIU wrote", ms, ds.PagesWritten)
	}
	t.Logf("dump: runc checkpoint %v; criu frozen %v (freezing %v, memdump %v, memwrite %v), pages scanned %d written %d",
		dumpWall, ds.FrozenTime, ds.FreezingTime, ds.MemdumpTime, ds.MemwriteTime, ds.PagesScanned, ds.PagesWritten)
	t.Logf("restore: runc restore %v; criu restore %v (forking %v), pages restored %d compared %d",
		restoreWall, rs.RestoreTime, rs.ForkingTime, rs.PagesRestored, rs.PagesCompared)
	// CRIU counts the two from different moments: when the cgroup
	// freezer needs a second look (a 100 ms wait), freezing exceeds
	// frozen. Both lie within the wall time of the dump.
	if ds.FrozenTime <= 0 || ds.FrozenTime > dumpWall || ds.FreezingTime <= 0 || ds.FreezingTime > dumpWall {
		t.Errorf("frozen %v, freezing %v: want both in (0, wall %v]", ds.FrozenTime, ds.FreezingTime, dumpWall)
	}
	if ds.PagesWritten == 0 || ds.PagesWritten > ds.PagesScanned || ds.PagesLazy != 0 {
		t.Errorf("pages written %d scanned %d lazy %d: want 0 < written <= scanned, none lazy",
			ds.PagesWritten, ds.PagesScanned, ds.PagesLazy)
	}
	if rs.RestoreTime <= 0 || rs.RestoreTime > restoreWall || rs.ForkingTime > rs.RestoreTime {
		t.Errorf("restore %v, forking %v: want 0 < forking <= restore <= wall %v", rs.RestoreTime, rs.ForkingTime, restoreWall)
	}
	// CRIU maps some dumped pages (the vDSO's) instead of copying them.
	if rs.PagesRestored == 0 || rs.PagesRestored > ds.PagesWritten {
		t.Errorf("restored %d pages, dump wrote %d: want 0 < restored <= written", rs.PagesRestored, ds.PagesWritten)
	}

	if err := r.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	assertGone(t, r, id, nsB, specB.CgroupsPath)
}

// TestRestoreCorruptImages restores from damaged images: the error must
// carry CRIU's reason, and nothing of the container may be left behind.
func TestRestoreCorruptImages(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	ns := testutil.NewNetNS(t, "rbrk")
	id := testutil.UniqueName("brk")
	spec := testSpec(t, ns, counterArgs...)
	var out syncBuffer
	if _, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, &out, 3)
	images := filepath.Join(t.TempDir(), "images")
	if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
	}{
		{"garbage inventory", func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "inventory.img"), []byte("this is not a criu image"))
		}},
		{"truncated process tree", func(t *testing.T, dir string) {
			data, err := os.ReadFile(filepath.Join(dir, "pstree.img"))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "pstree.img"), data[:len(data)/2])
		}},
		{"garbage core image", func(t *testing.T, dir string) {
			cores, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
			if err != nil || len(cores) == 0 {
				t.Fatalf("no core images (%v)", err)
			}
			write(t, cores[0], []byte("this is not a core image"))
		}},
		{"missing core image", func(t *testing.T, dir string) {
			cores, err := filepath.Glob(filepath.Join(dir, "core-*.img"))
			if err != nil || len(cores) == 0 {
				t.Fatalf("no core images (%v)", err)
			}
			for _, c := range cores {
				if err := os.Remove(c); err != nil {
					t.Fatal(err)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "images")
			if out, err := exec.Command("cp", "-a", images, dir).CombinedOutput(); err != nil {
				t.Fatalf("copy images: %v: %s", err, out)
			}
			tt.damage(t, dir)
			restoreSpec := spec
			restoreSpec.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
			var out syncBuffer
			_, err := r.Restore(ctx, id, writeBundle(t, restoreSpec), runc.RestoreOpts{ImagePath: dir}, runc.IO{Stdout: &out})
			if err == nil {
				t.Fatal("restore from damaged images succeeded")
			}
			t.Logf("restore error: %v", err)
			var re *runc.Error
			if !errors.As(err, &re) {
				t.Fatalf("got %T, want a *runc.Error", err)
			}
			if re.CRIUReason == "" || !strings.Contains(err.Error(), re.CRIUReason) ||
				!strings.Contains(err.Error(), filepath.Join(dir, runc.RestoreLog)) {
				t.Errorf("error %q lacks CRIU's reason and log path", err)
			}
			if !strings.Contains(re.CRIUReason, "Error") {
				t.Errorf("CRIU reason %q has no CRIU error line", re.CRIUReason)
			}
			assertGone(t, r, id, ns, restoreSpec.CgroupsPath)
		})
	}
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A runc killed in the middle of a restore leaves a state directory
// without state.json, its CRIU root still mounted there: runc can neither
// load nor delete it, and refuses a new container of that id. A forced
// Delete removes it, so the id can be used again.
func TestDeleteHalfMadeState(t *testing.T) {
	r := newRuntime(t)
	ctx := context.Background()
	dir := filepath.Join(r.Root, "half")
	root := filepath.Join(dir, "criu-root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("mount", "--bind", t.TempDir(), root).Run(); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = linux.Unmount(root) })
	if err := r.Delete(ctx, "half", true); err != nil && !errors.Is(err, runc.ErrNotFound) {
		t.Fatalf("delete: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state directory left: %v", err)
	}
	if m, _ := linux.MountsUnder(dir); len(m) > 0 {
		t.Fatalf("mounts left: %v", m)
	}
}

// TestRestoreRestartsInterruptedWait checkpoints a task blocked in a poll
// with a timeout and restores it: the task must go on waiting until its
// timeout rather than see the EINTR CRIU's dump records for a call the
// kernel restarts through a restart block (criuimg.RestartSyscalls).
func TestRestoreRestartsInterruptedWait(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	testutil.RequireTool(t, "cc")
	bin := t.TempDir()
	if out, err := exec.Command("cc", "-static", "-O2", "-o", filepath.Join(bin, "pollwait"), "testdata/pollwait.c").CombinedOutput(); err != nil {
		t.Skipf("skipped: cannot build a static test program (%v): %s", err, out)
	}
	ns := testutil.NewNetNS(t, "rcpw")
	id := testutil.UniqueName("pw")
	spec := testSpec(t, ns, "/opt/pw/pollwait", "3000")
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/opt/pw", Type: "bind", Source: bin, Options: []string{"bind", "ro"}})
	var before syncBuffer
	if _, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{Stdout: &before, Stderr: &before}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		if !strings.Contains(before.String(), "waiting") {
			return fmt.Errorf("output %q", before.String())
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // into the poll
	images := filepath.Join(t.TempDir(), "images")
	if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images}); err != nil {
		t.Fatal(err)
	}
	if before.String() != "waiting\n" {
		t.Fatalf("the wait ended before the checkpoint: %q", before.String())
	}
	var after syncBuffer
	start := time.Now()
	if _, err := r.Restore(ctx, id, writeBundle(t, spec), runc.RestoreOpts{ImagePath: images}, runc.IO{Stdout: &after, Stderr: &after}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if after.String() == "" {
			return errors.New("no word from the restored task yet")
		}
		return nil
	})
	if got := strings.TrimSpace(after.String()); got != "timeout" {
		t.Fatalf("restored task's wait ended with %q after %v, want its timeout", got, time.Since(start))
	}
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("the restored wait ended after %v: it did not wait again", waited)
	}
}

// A runc stopped right after CRIU wrote the last image (the moment a
// migration ships the images, and the moment a failed send rolls back)
// is killed while it removes the dumped container: it may leave it
// stopped, half removed (no state.json, runc refuses the id), or gone.
// RemoveDumped clears each, so the service can be restored under its id.
func TestRestoreAfterCheckpointKilledRemoving(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	ns := testutil.NewNetNS(t, "rckr")
	id := testutil.UniqueName("kr")
	spec := testSpec(t, ns, counterArgs...)
	bundle := writeBundle(t, spec)
	var out syncBuffer
	if _, err := r.Run(ctx, id, bundle, runc.IO{Stdout: &out, Stderr: &out}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Delete(context.Background(), id, true) })
	waitCount(t, &out, 3)
	seen := map[string]int{}
	const rounds = 12
	for i := range rounds + 1 {
		images := filepath.Join(t.TempDir(), "images")
		cctx, cancel := context.WithCancel(ctx)
		// Killed at once, or a little later: runc removes the container
		// within a millisecond or so of the last image.
		ready := func() { time.AfterFunc(time.Duration(i)*100*time.Microsecond, cancel) }
		if i == rounds {
			ready = nil // the last round's runc completes ...
		}
		err := r.Checkpoint(cctx, id, runc.CheckpointOpts{ImagePath: images, WorkPath: images, Ready: ready})
		cancel()
		if i == rounds {
			if err != nil {
				t.Fatal(err)
			}
			// ... and its state directory is made again, as one killed
			// in its last removal leaves it: empty.
			if err := os.Mkdir(filepath.Join(r.Root, id), 0o711); err != nil {
				t.Fatal(err)
			}
		}
		left := "gone"
		if _, serr := r.State(ctx, id); serr == nil {
			left = "stopped"
		} else if _, derr := os.Stat(filepath.Join(r.Root, id)); derr == nil {
			left = "half removed"
		}
		seen[left]++
		t.Logf("round %d: checkpoint: err %v; container %s", i, err, left)
		if _, serr := os.Stat(filepath.Join(images, "inventory.img")); serr != nil {
			t.Fatalf("round %d: no images after the dump: %v", i, serr)
		}
		if err := r.RemoveDumped(ctx, id); err != nil {
			t.Fatalf("round %d: remove dumped (%s): %v", i, left, err)
		}
		last := out.ints(t)
		if _, err := r.Restore(ctx, id, bundle, runc.RestoreOpts{ImagePath: images, WorkPath: images + "-r"}, runc.IO{Stdout: &out, Stderr: &out}); err != nil {
			t.Fatalf("round %d: restore after a checkpoint killed while removing (%s): %v", i, left, err)
		}
		n := last[len(last)-1]
		testutil.Eventually(t, 5*time.Second, func() error {
			if got := out.ints(t); got[len(got)-1] < n+2 {
				return fmt.Errorf("counter at %d, want past %d", got[len(got)-1], n+1)
			}
			return nil
		})
	}
	t.Logf("left behind by the killed runc: %v", seen)
	// A running container is not a dumped one.
	if err := r.RemoveDumped(ctx, id); err == nil {
		t.Error("RemoveDumped removed a running container")
	}
}

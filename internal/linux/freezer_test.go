package linux

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFreezeCgroup freezes a cgroup holding a busy process, checks the
// process stops using CPU, thaws it and checks it runs again.
func TestFreezeCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	rel := fmt.Sprintf("/edgehop-test-freeze-%d", os.Getpid())
	procs := filepath.Join(cgroupRoot, "freezer", rel)
	if _, err := os.Stat(filepath.Join(cgroupRoot, "freezer")); err != nil {
		procs = filepath.Join(cgroupRoot, rel) // v2
	}
	if err := os.Mkdir(procs, 0o755); err != nil {
		t.Skipf("cannot create cgroup %s: %v", procs, err)
	}
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ThawCgroup(context.Background(), rel)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for i := 0; i < 50 && os.Remove(procs) != nil; i++ {
			time.Sleep(20 * time.Millisecond)
		}
	})
	if err := os.WriteFile(filepath.Join(procs, "cgroup.procs"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := FreezeCgroup(ctx, rel); err != nil {
		t.Fatal(err)
	}
	t1 := cpuTicks(t, cmd.Process.Pid)
	time.Sleep(200 * time.Millisecond)
	if t2 := cpuTicks(t, cmd.Process.Pid); t2 != t1 {
		t.Fatalf("frozen process used CPU: %d -> %d ticks", t1, t2)
	}
	if err := ThawCgroup(ctx, rel); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if t3 := cpuTicks(t, cmd.Process.Pid); t3 == t1 {
		t.Fatal("thawed process did not run")
	}
	if err := FreezeCgroup(ctx, "/edgehop-no-such-cgroup"); err == nil {
		t.Error("freezing a missing cgroup succeeded")
	}
}

// cpuTicks is utime+stime of pid.
func cpuTicks(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	var u, s int64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &s)
	return u + s
}

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
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	rel := inTestCgroup(t, "freeze", cmd)
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

// TestFreezeCgroupSeizable: a process that is in a vfork half of the time
// is caught there by a plain freeze; FreezeCgroupSeizable never leaves it
// there.
func TestFreezeCgroupSeizable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: needed to build a vfork helper (make setup installs build-essential)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "vf.c")
	// The child sleeps 20 ms and exits; the parent waits 20 ms and vforks
	// again: the parent waits for a vfork child half of the time.
	prog := `#include <unistd.h>
#include <time.h>
#include <sys/wait.h>
int main(void) {
	struct timespec d = {0, 20000000};
	for (;;) {
		pid_t p = vfork();
		if (p == 0) { nanosleep(&d, 0); _exit(0); }
		waitpid(p, 0, 0);
		nanosleep(&d, 0);
	}
}
`
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "vf")
	if out, err := exec.Command(cc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("build vfork helper: %v\n%s", err, out)
	}
	rel := inTestCgroup(t, "vfork", exec.Command(bin))
	ctx := context.Background()
	caught := 0
	for i := 0; i < 40 && caught == 0; i++ {
		if err := FreezeCgroup(ctx, rel); err != nil {
			t.Fatal(err)
		}
		w, err := VforkWaiters(rel)
		if err != nil {
			t.Fatal(err)
		}
		caught += len(w)
		if err := ThawCgroup(ctx, rel); err != nil {
			t.Fatal(err)
		}
		time.Sleep(7 * time.Millisecond)
	}
	if caught == 0 {
		t.Fatal("40 plain freezes never caught the parent in its vfork wait: the check has nothing to find here")
	}
	for i := 0; i < 20; i++ {
		tries, err := FreezeCgroupSeizable(ctx, rel, 20)
		if err != nil {
			t.Fatal(err)
		}
		if w, _ := settledVforkWaiters(rel); len(w) != 0 {
			t.Fatalf("freeze %d left %v in a vfork wait after %d tries", i, w, tries)
		}
		if err := ThawCgroup(ctx, rel); err != nil {
			t.Fatal(err)
		}
		time.Sleep(7 * time.Millisecond)
	}
}

// inTestCgroup starts cmd in a new cgroup of its own (freezer hierarchy on
// v1) and returns the cgroup's path; cleanup thaws and kills it and
// removes the cgroup.
func inTestCgroup(t *testing.T, name string, cmd *exec.Cmd) string {
	t.Helper()
	rel := fmt.Sprintf("/edgehop-test-%s-%d", name, os.Getpid())
	procs := filepath.Join(cgroupRoot, "freezer", rel)
	if _, err := os.Stat(filepath.Join(cgroupRoot, "freezer")); err != nil {
		procs = filepath.Join(cgroupRoot, rel) // v2
	}
	if err := os.Mkdir(procs, 0o755); err != nil {
		t.Skipf("cannot create cgroup %s: %v", procs, err)
	}
	if err := cmd.Start(); err != nil {
		_ = os.Remove(procs)
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
	return rel
}

// A zombie shows no wait channel, and never will: settling does not wait
// for it.
func TestDeadTask(t *testing.T) {
	if deadTask(os.Getpid()) {
		t.Fatal("this process reads as dead")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for !deadTask(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("exited child %d never read as a zombie", cmd.Process.Pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// KillCgroup kills every process of a frozen cgroup (they die once it is
// thawed), and a missing cgroup holds nothing to kill.
func TestKillCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	cmd := exec.Command("sleep", "600")
	rel := inTestCgroup(t, "kill", cmd)
	if err := FreezeCgroup(context.Background(), rel); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	n, err := KillCgroup(context.Background(), rel)
	if err != nil || n != 1 {
		t.Fatalf("KillCgroup = %d, %v; want 1 process", n, err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the process exited cleanly, not killed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the frozen process survived KillCgroup")
	}
	if n, err := KillCgroup(context.Background(), "/edgehop-no-such-cgroup"); n != 0 || err != nil {
		t.Errorf("missing cgroup: %d, %v", n, err)
	}
}

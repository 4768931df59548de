package linux

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// FreezeCgroup freezes every task of the cgroup at path (relative to each
// hierarchy's root, as in an OCI spec's cgroupsPath) and returns once the
// kernel reports it frozen. It does what `runc pause` does, without
// starting runc inside the frozen window. It uses the v1 freezer where
// that hierarchy is mounted, cgroup.freeze (v2) otherwise.
func FreezeCgroup(ctx context.Context, path string) error {
	return setFrozen(ctx, path, true)
}

// ThawCgroup undoes FreezeCgroup.
func ThawCgroup(ctx context.Context, path string) error {
	return setFrozen(ctx, path, false)
}

func setFrozen(ctx context.Context, path string, frozen bool) error {
	v1 := filepath.Join(cgroupRoot, "freezer", path, "freezer.state")
	if _, err := os.Stat(v1); err == nil {
		want := "THAWED"
		if frozen {
			want = "FROZEN"
		}
		return pollCgroup(ctx, v1, want, func(got string) bool { return got == want }, v1, want)
	}
	v2 := filepath.Join(cgroupRoot, path, "cgroup.freeze")
	if _, err := os.Stat(v2); err != nil {
		return fmt.Errorf("freezer of cgroup %s: no v1 freezer.state or v2 cgroup.freeze: %w", path, err)
	}
	val, want := "0", "frozen 0"
	if frozen {
		val, want = "1", "frozen 1"
	}
	events := filepath.Join(cgroupRoot, path, "cgroup.events")
	return pollCgroup(ctx, events, want, func(got string) bool {
		for _, l := range strings.Split(got, "\n") {
			if l == want {
				return true
			}
		}
		return false
	}, v2, val)
}

// pollCgroup writes val to ctl, then reads file until done says so; a
// v1 freezer may stay FREEZING while a task is in an uninterruptible
// wait, so the write is repeated as runc does.
func pollCgroup(ctx context.Context, file, want string, done func(string) bool, ctl, val string) error {
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		if i%10 == 0 {
			if err := os.WriteFile(ctl, []byte(val), 0o644); err != nil {
				return fmt.Errorf("write %s to %s: %w", val, ctl, err)
			}
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		got := strings.TrimSpace(string(b))
		if done(got) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: still %q after 10s, want %q", file, got, want)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), os.WriteFile(ctl, []byte(thawValue(val)), 0o644))
		case <-time.After(time.Millisecond):
		}
	}
}

// thawValue is the value that undoes val, for giving up on a freeze.
func thawValue(val string) string {
	switch val {
	case "FROZEN":
		return "THAWED"
	case "1":
		return "0"
	}
	return val
}

// FreezeCgroupSeizable is FreezeCgroup that does not leave a task frozen
// in the middle of a vfork: a parent waiting for its vfork child to exec
// or exit cannot be seized by ptrace, and CRIU then gives up on the dump
// after its timeout (10 s, "Unseizable non-zombie … state D") with the
// service frozen all along. A shell service running commands is in that
// wait a few percent of the time. When one is caught, the cgroup is
// thawed for a moment, so the child can exec, and frozen again, up to
// tries times; it reports how many tries that took.
func FreezeCgroupSeizable(ctx context.Context, path string, tries int) (int, error) {
	for i := 1; ; i++ {
		if err := FreezeCgroup(ctx, path); err != nil {
			return i, err
		}
		waiting, err := settledVforkWaiters(path)
		if err != nil || len(waiting) == 0 || i >= tries {
			return i, nil // an unreadable task list: CRIU decides
		}
		if err := ThawCgroup(ctx, path); err != nil {
			return i, err
		}
		select {
		case <-ctx.Done():
			return i, ctx.Err()
		case <-time.After(time.Duration(i) * time.Millisecond):
		}
	}
}

// cgroupFile is the file v1 of the cgroup at path in the v1 freezer
// hierarchy where that is mounted, the file v2 of its v2 cgroup otherwise.
func cgroupFile(path, v1, v2 string) string {
	f := filepath.Join(cgroupRoot, "freezer", path, v1)
	if _, err := os.Stat(f); err == nil {
		return f
	}
	return filepath.Join(cgroupRoot, path, v2)
}

// VforkWaiters lists the tasks of the cgroup at path that wait for a
// vfork child (their kernel wait channel is kernel_clone, where the
// parent of a vfork sleeps until the child execs or exits).
func VforkWaiters(path string) ([]int, error) {
	waiting, _, err := vforkScan(path)
	return waiting, err
}

// Settling: how often, and how far apart, a frozen cgroup's tasks are read
// again while one of them has no wait channel yet.
const (
	settleReads = 20
	settlePause = 100 * time.Microsecond
)

// settledVforkWaiters is VforkWaiters for a frozen cgroup, read again
// while a task shows no wait channel. The kernel shows one only for a task
// off its run queue, and a task the freezer caught as it went to sleep can
// stay queued, frozen, for a moment after the cgroup reads FROZEN (the
// scheduler dequeues a sleeping task late, its delayed dequeue): read
// then, a parent in its vfork wait looks like one that is not waiting.
// Such a task settles within a fraction of a millisecond; the reads stop
// after settleReads, leaving what is still unsettled to CRIU.
func settledVforkWaiters(path string) ([]int, error) {
	waiting, queued, err := vforkScan(path)
	for i := 0; err == nil && queued > 0 && i < settleReads; i++ {
		time.Sleep(settlePause)
		waiting, queued, err = vforkScan(path)
	}
	return waiting, err
}

// vforkScan reads the wait channel of each task of the cgroup at path: the
// tasks waiting for a vfork child, and how many show none (running, or
// still on a run queue) without being dead.
func vforkScan(path string) (waiting []int, queued int, err error) {
	b, err := os.ReadFile(cgroupFile(path, "tasks", "cgroup.threads"))
	if err != nil {
		return nil, 0, err
	}
	for _, f := range strings.Fields(string(b)) {
		var tid int
		if _, err := fmt.Sscan(f, &tid); err != nil {
			continue
		}
		w, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", tid))
		if err != nil {
			continue // gone
		}
		switch ch := string(w); {
		case ch == "kernel_clone" || strings.Contains(ch, "vfork"):
			waiting = append(waiting, tid)
		case ch == "0" && !deadTask(tid):
			queued++
		}
	}
	return waiting, queued, nil
}

// deadTask says whether the task is a zombie or gone: it has no wait
// channel and never will.
func deadTask(tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", tid))
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st == 'Z' || st == 'X'
}

// KillCgroup sends SIGKILL to every process of the cgroup at path (the
// v1 freezer hierarchy's, else v2's) but the caller's own, then thaws the
// cgroup so that frozen ones die too, and returns how many it signalled.
// A cgroup that does not exist holds nothing to kill. It is what removes
// a container whose runc cannot: a half-done restore's CRIU, which runs
// in the container's cgroups and outlives the agent that started it,
// keeps the restored init from exiting (it waits in
// zap_pid_ns_processes for tasks CRIU still traces).
func KillCgroup(ctx context.Context, path string) (int, error) {
	b, err := os.ReadFile(cgroupFile(path, "cgroup.procs", "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kill cgroup %s: %w", path, err)
	}
	self, n := os.Getpid(), 0
	var errs []error
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 || pid == self {
			continue
		}
		if err := Kill(pid); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if n > 0 {
		if err := ThawCgroup(ctx, path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

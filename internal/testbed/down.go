package testbed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// Down removes everything testbed name created: its agents, containers and
// link daemon, every process inside its namespaces, its mounts, its
// namespaces and its state directory. It works from what is on the machine,
// not only from the recorded state, so it also cleans up after a crash. A
// testbed that does not exist is not an error.
func Down(ctx context.Context, root, name string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir := Dir(root, name)
	nsPaths, _ := filepath.Glob(linux.NetNSPath(nsName(name, "*")))
	var errs []error

	// 0. The supervisor stops restarting what dies (it keeps reaping).
	signalPidFile(filepath.Join(dir, "supervisor.pid"), syscall.SIGUSR1)
	// 1. Agents first, so nothing re-announces containers.
	pidFiles, _ := filepath.Glob(filepath.Join(dir, "*", "*.pid"))
	more, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "*.pid"))
	pidFiles = append(pidFiles, more...)
	for _, pf := range pidFiles {
		killPidFile(pf)
	}
	// 2. Containers through runc, which also removes their cgroups.
	runcRoots, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "runc"))
	for _, rr := range runcRoots {
		errs = append(errs, deleteRuncContainers(ctx, rr))
	}
	// 3. Every process left in any testbed namespace, including container
	// namespaces bound under the state dir.
	ctrNS, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "netns", "*"))
	all := append(append([]string{}, nsPaths...), ctrNS...)
	errs = append(errs, killInNamespaces(ctx, all))
	// 4. Mounts under the state dir (container rootfs, namespace binds).
	mounts, err := linux.MountsUnder(dir)
	errs = append(errs, err)
	for _, m := range mounts {
		errs = append(errs, linux.Unmount(m))
	}
	// 5. The supervisor last: it reaps what the steps above killed.
	killPidFile(filepath.Join(dir, "supervisor.pid"))
	// 6. Namespaces, cgroups, then the state directory.
	for _, p := range nsPaths {
		errs = append(errs, linux.DeleteNetNS(p))
	}
	errs = append(errs, removeCgroups(name))
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("testbed %s down: %w", name, err)
	}
	log.Info("testbed down", "name", name, "namespaces", len(nsPaths))
	return nil
}

// signalPidFile sends sig to the live process of a pid file.
func signalPidFile(pf string, sig syscall.Signal) {
	b, err := os.ReadFile(pf)
	if err != nil || !alive(pf) {
		return
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err == nil && pid > 1 {
		_ = syscall.Kill(pid, sig)
	}
}

func killPidFile(pf string) {
	b, err := os.ReadFile(pf)
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &pid); err != nil || pid <= 1 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && alive(pf) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pf) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func deleteRuncContainers(ctx context.Context, runcRoot string) error {
	out, err := exec.CommandContext(ctx, "runc", "--root", runcRoot, "list", "-q").Output()
	if err != nil {
		return nil // no runc state: nothing to delete
	}
	var errs []error
	for _, id := range strings.Fields(string(out)) {
		if b, err := exec.CommandContext(ctx, "runc", "--root", runcRoot, "delete", "-f", id).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("runc delete %s: %v: %s", id, err, strings.TrimSpace(string(b))))
		}
	}
	return errors.Join(errs...)
}

func killInNamespaces(ctx context.Context, paths []string) error {
	self := os.Getpid()
	var inodes []uint64
	for _, p := range paths {
		if ino, err := linux.NetNSInode(p); err == nil {
			inodes = append(inodes, ino)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []int
		for _, ino := range inodes {
			pids, _ := linux.PIDsInNetNS(ino)
			for _, p := range pids {
				if p != self {
					left = append(left, p)
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("processes still alive in testbed namespaces: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeCgroups removes the (empty, once the containers are gone) cgroup
// directories of the testbed's nodes in every hierarchy: runc removes a
// container's own cgroup, not the per-node parents edgehop puts it under.
func removeCgroups(tb string) error {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "edgehop", tb+"-*"))
	more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "edgehop", tb+"-*"))
	var errs []error
	for _, d := range append(dirs, more...) {
		// Children first: walk collects parents before children.
		var all []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			if err := os.Remove(all[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", all[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// SaveLogs copies the logs of testbed name (its agents', link daemon's,
// controller's and supervisor's, each *.log under its state directory) to
// dst, keeping their paths relative to the state directory, so that they
// outlive Down. It returns the files it copied.
func SaveLogs(root, name, dst string) ([]string, error) {
	dir := Dir(root, name)
	var saved []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // a container's directory going away meanwhile
		}
		if d.IsDir() {
			if rel, _ := filepath.Rel(dir, p); strings.Count(rel, string(filepath.Separator)) > 3 {
				return filepath.SkipDir // container root filesystems hold no testbed log
			}
			return nil
		}
		if !d.Type().IsRegular() || filepath.Ext(p) != ".log" {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		to := filepath.Join(dst, rel)
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("save %s: %w", p, err)
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			return err
		}
		saved = append(saved, to)
		return nil
	})
	return saved, err
}

package runc_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

// cgroupEntries lists dir's directories and symlinks (with their targets).
func cgroupEntries(t *testing.T, dir string) ([]string, map[string]string) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	links := map[string]string{}
	for _, e := range es {
		p := filepath.Join(dir, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			to, err := os.Readlink(p)
			if err != nil {
				t.Fatal(err)
			}
			links[e.Name()] = to
		case e.IsDir():
			dirs = append(dirs, e.Name())
		default:
			t.Errorf("%s: neither a directory nor a symlink", p)
		}
	}
	sort.Strings(dirs)
	return dirs, links
}

// TestMountsOutOfImages: the cgroup skeleton and MakeDevDir hold what runc
// puts in a container's /sys/fs/cgroup and /dev on this host. A container
// run with /dev and /dev/shm bound from directories and dumped with the
// masks and the cgroup tmpfs external has no tmpfs in its images; it
// restores onto them with every cgroup hierarchy mounted on the
// read-only skeleton, its devices working and its /dev/shm files there,
// and counts on.
func TestMountsOutOfImages(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	dirs, links, err := runc.CgroupSkeleton()
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Skip("skipped: no cgroup v1 hierarchies (runc mounts cgroup2, no tmpfs)")
	}
	skel := filepath.Join(t.TempDir(), "cgroupfs")
	if ok, err := runc.MountCgroupSkeleton(skel); err != nil || !ok {
		t.Fatalf("mount skeleton: %v %v", ok, err)
	}
	t.Cleanup(func() { _ = linux.Unmount(skel) })
	if err := os.Mkdir(filepath.Join(skel, "x"), 0o755); err == nil {
		t.Error("the skeleton is writable")
	}
	mask := filepath.Join(t.TempDir(), "mask")
	if err := linux.MountEmptyReadOnly(mask); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = linux.Unmount(mask) })
	conf := filepath.Join(t.TempDir(), "criu.conf")
	if err := runc.WriteCRIUConfig(conf, runc.SkipNetworkLock+runc.ExternalMasks(mask)+runc.ExternalCgroupFS(skel)); err != nil {
		t.Fatal(err)
	}

	ns := testutil.NewNetNS(t, "cgfs")
	// runc's own /sys/fs/cgroup and /dev, in a container run as usual.
	plain := testSpec(t, ns, counterArgs...)
	pid, err := r.Run(ctx, "plain-"+testutil.UniqueName("c"), writeBundle(t, plain), runc.IO{})
	if err != nil {
		t.Fatal(err)
	}
	gotDirs, gotLinks := cgroupEntries(t, fmt.Sprintf("/proc/%d/root/sys/fs/cgroup", pid))
	if !reflect.DeepEqual(gotDirs, dirs) || !reflect.DeepEqual(gotLinks, links) {
		t.Fatalf("runc's /sys/fs/cgroup: dirs %v links %v; skeleton: dirs %v links %v", gotDirs, gotLinks, dirs, links)
	}
	runcDev := devEntries(t, fmt.Sprintf("/proc/%d/root/dev", pid))
	devDir := filepath.Join(t.TempDir(), "dev")
	if err := runc.MakeDevDir(devDir); err != nil {
		t.Fatal(err)
	}
	if ours := devEntries(t, devDir); !reflect.DeepEqual(ours, runcDev) {
		t.Fatalf("runc's /dev:\n%v\nMakeDevDir:\n%v", runcDev, ours)
	}
	states, _ := r.List(ctx)
	for _, st := range states {
		if err := r.Delete(ctx, st.ID, true); err != nil {
			t.Fatal(err)
		}
	}

	id := testutil.UniqueName("cgfs")
	spec := testSpec(t, ns, counterArgs...)
	spec.Annotations = map[string]string{runc.CRIUConfigAnnotation: conf}
	spec.DevDir = devDir
	// /dev/shm a bind of a directory, as the agent makes it: out of the
	// images too, its files kept by the directory.
	shm := filepath.Join(t.TempDir(), "shm")
	if err := os.Mkdir(shm, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(shm, "seg"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec.ShmDir = shm
	var out syncBuffer
	if _, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{Stdout: &out, Stderr: &out}); err != nil {
		t.Fatal(err)
	}
	waitCount(t, &out, 3)

	images := filepath.Join(t.TempDir(), "images")
	if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images}); err != nil {
		t.Fatal(err)
	}
	last := out.ints(t)
	if tars, _ := filepath.Glob(filepath.Join(images, "tmpfs-dev-*")); len(tars) != 0 {
		t.Errorf("want no tmpfs in the images, got %d: %v", len(tars), tars)
	}

	spec.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
	var after syncBuffer
	pid, err = r.Restore(ctx, id, writeBundle(t, spec), runc.RestoreOpts{ImagePath: images}, runc.IO{Stdout: &after, Stderr: &after})
	if err != nil {
		t.Fatal(err)
	}
	consecutive(t, "after restore", waitCount(t, &after, 3), last[len(last)-1]+1)
	cg := fmt.Sprintf("/proc/%d/root/sys/fs/cgroup", pid)
	if gd, gl := cgroupEntries(t, cg); !reflect.DeepEqual(gd, dirs) || !reflect.DeepEqual(gl, links) {
		t.Errorf("restored /sys/fs/cgroup: dirs %v links %v, want %v %v", gd, gl, dirs, links)
	}
	if b, err := os.ReadFile(filepath.Join(fmt.Sprintf("/proc/%d/root", pid), "dev", "shm", "seg")); err != nil || string(b) != "kept" {
		t.Errorf("restored /dev/shm/seg: %q, %v", b, err)
	}
	var null syscall.Stat_t
	err = syscall.Stat(filepath.Join(fmt.Sprintf("/proc/%d/root", pid), "dev", "null"), &null)
	if major, minor := linux.DeviceNumbers(null.Rdev); err != nil || null.Mode&syscall.S_IFMT != syscall.S_IFCHR || major != 1 || minor != 3 {
		t.Errorf("restored /dev/null: mode %o rdev %x, %v; want the null device", null.Mode, null.Rdev, err)
	}
	for _, d := range dirs {
		if st, err := linux.StatFileSystem(filepath.Join(cg, d)); err != nil || st.Type != linux.CgroupMagic {
			t.Errorf("restored /sys/fs/cgroup/%s: statfs type %#x, %v; want a cgroup mount", d, st.Type, err)
		}
	}
	if st, err := linux.StatFileSystem(cg); err != nil || !st.ReadOnly {
		t.Errorf("restored /sys/fs/cgroup: %+v %v, want read-only", st, err)
	}
	if err := r.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
}

// devEntries describes each entry of a /dev directory: its type, and its
// mode, owner and device numbers, or its link target.
func devEntries(t *testing.T, dir string) map[string]string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range es {
		p := filepath.Join(dir, e.Name())
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		d := fmt.Sprintf("mode %o uid %d gid %d", st.Mode, st.Uid, st.Gid)
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			d = "dir" // a mount point in a container: what shows is the mount's root
		case syscall.S_IFLNK:
			to, _ := os.Readlink(p)
			d = "-> " + to
		case syscall.S_IFCHR, syscall.S_IFBLK:
			major, minor := linux.DeviceNumbers(st.Rdev)
			d += fmt.Sprintf(" dev %d:%d", major, minor)
		}
		out[e.Name()] = d
	}
	return out
}

// TestRestoredSeesItsCgroups: runc 1.1 restores a container's cgroup
// mount as binds of the cgroups the restoring runc is in. Restored with
// RestoreOpts.Cgroups under another cgroup path (as on another node), the
// container sees that path in every hierarchy, and its tasks are there;
// without, it sees the test's own cgroups. CRIU leaves the cgroups to
// runc (IgnoreCgroups).
func TestRestoredSeesItsCgroups(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	skel := filepath.Join(t.TempDir(), "cgroupfs")
	if ok, err := runc.MountCgroupSkeleton(skel); err != nil {
		t.Fatal(err)
	} else if !ok {
		t.Skip("skipped: no cgroup v1 hierarchies (runc mounts cgroup2, no tmpfs)")
	}
	t.Cleanup(func() { _ = linux.Unmount(skel) })
	v1, err := runc.LoadCgroupV1()
	if err != nil {
		t.Fatal(err)
	}
	if v1 == nil {
		t.Skip("skipped: the cgroup v1 hierarchies are mounted from below their roots (a cgroup namespace)")
	}
	conf := filepath.Join(t.TempDir(), "criu.conf")
	if err := runc.WriteCRIUConfig(conf, runc.SkipNetworkLock+runc.IgnoreCgroups+runc.ExternalCgroupFS(skel)); err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNetNS(t, "cgb")
	for _, own := range []bool{true, false} {
		id := testutil.UniqueName("cgb")
		spec := testSpec(t, ns, counterArgs...)
		spec.Annotations = map[string]string{runc.CRIUConfigAnnotation: conf}
		var out syncBuffer
		pid, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		waitCount(t, &out, 3)
		if bad := ownCgroups(t, pid, v1, spec.CgroupsPath); len(bad) > 0 {
			t.Fatalf("run: %v", bad)
		}
		images := filepath.Join(t.TempDir(), "images")
		if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images}); err != nil {
			t.Fatal(err)
		}
		last := out.ints(t)
		// CRIU left the cgroups to runc (IgnoreCgroups): it read none of
		// their properties, which it logs one by one otherwise.
		if log, err := os.ReadFile(filepath.Join(images, runc.DumpLog)); err != nil || strings.Contains(string(log), "cg: Dumping value") {
			t.Errorf("dump log (%v): CRIU dumped cgroup properties", err)
		}
		spec.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
		opts := runc.RestoreOpts{ImagePath: images}
		if own {
			if err := v1.Make(spec.CgroupsPath); err != nil {
				t.Fatal(err)
			}
			opts.Cgroups = v1.Dirs(spec.CgroupsPath)
		}
		var after syncBuffer
		pid, err = r.Restore(ctx, id, writeBundle(t, spec), opts, runc.IO{Stdout: &after, Stderr: &after})
		if err != nil {
			t.Fatal(err)
		}
		consecutive(t, "after restore", waitCount(t, &after, 3), last[len(last)-1]+1)
		bad := ownCgroups(t, pid, v1, spec.CgroupsPath)
		switch {
		case own && len(bad) > 0:
			t.Errorf("restored in its cgroups: %v", bad)
		case !own && len(bad) == 0:
			t.Errorf("restored from the test's cgroups, it sees its own: the check cannot fail")
		case !own:
			t.Logf("restored from the test's cgroups, as runc 1.1 does it: %v", bad)
		}
		if err := r.Delete(ctx, id, true); err != nil {
			t.Fatal(err)
		}
		if err := v1.Remove(spec.CgroupsPath); err != nil {
			t.Error(err)
		}
		for _, d := range v1.Dirs(spec.CgroupsPath) {
			if _, err := os.Stat(d.Dir()); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s left: %v", d, err)
			}
		}
	}
}

// ownCgroups lists what is wrong with the cgroups pid sees: every
// hierarchy at /sys/fs/cgroup must be a read-only bind of cgroupsPath,
// and pid must be in it.
func ownCgroups(t *testing.T, pid int, v1 *runc.CgroupV1, cgroupsPath string) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	roots := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 && strings.HasPrefix(f[4], "/sys/fs/cgroup/") {
			roots[strings.TrimPrefix(f[4], "/sys/fs/cgroup/")] = f[3] + " " + strings.Split(f[5], ",")[0]
		}
	}
	var bad []string
	for d := range v1.Hierarchies {
		if roots[d] != cgroupsPath+" ro" {
			bad = append(bad, fmt.Sprintf("/sys/fs/cgroup/%s shows %q", d, roots[d]))
		}
	}
	if _, ok := v1.Hierarchies["memory"]; ok {
		procs, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/sys/fs/cgroup/memory/cgroup.procs", pid))
		if err != nil || !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(pid)) {
			bad = append(bad, fmt.Sprintf("its memory cgroup.procs %q (%v) lacks its pid %d", procs, err, pid))
		}
	}
	slices.Sort(bad)
	return bad
}

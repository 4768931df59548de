package runc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	"golang.org/x/sys/unix"

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

// TestExternalCgroupFS: the skeleton holds what runc puts in a container's
// /sys/fs/cgroup on this host, and a container dumped with the tmpfs
// external restores onto the skeleton with every hierarchy mounted on it,
// read-only, and counts on; its /dev/shm, bound from a directory, is not
// in the images and shows the directory's files after the restore.
func TestExternalCgroupFS(t *testing.T) {
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
	t.Cleanup(func() { _ = unix.Unmount(skel, unix.MNT_DETACH) })
	if err := os.Mkdir(filepath.Join(skel, "x"), 0o755); err == nil {
		t.Error("the skeleton is writable")
	}
	mask := filepath.Join(t.TempDir(), "mask")
	if err := linux.MountEmptyReadOnly(mask); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mask, unix.MNT_DETACH) })
	conf := filepath.Join(t.TempDir(), "criu.conf")
	if err := runc.WriteCRIUConfig(conf, runc.SkipNetworkLock+runc.ExternalMasks(mask)+runc.ExternalCgroupFS(skel)); err != nil {
		t.Fatal(err)
	}

	ns := testutil.NewNetNS(t, "cgfs")
	id := testutil.UniqueName("cgfs")
	spec := testSpec(t, ns, counterArgs...)
	spec.Annotations = map[string]string{runc.CRIUConfigAnnotation: conf}
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
	pid, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	gotDirs, gotLinks := cgroupEntries(t, fmt.Sprintf("/proc/%d/root/sys/fs/cgroup", pid))
	if !reflect.DeepEqual(gotDirs, dirs) || !reflect.DeepEqual(gotLinks, links) {
		t.Fatalf("runc's /sys/fs/cgroup: dirs %v links %v; skeleton: dirs %v links %v", gotDirs, gotLinks, dirs, links)
	}
	waitCount(t, &out, 3)

	images := filepath.Join(t.TempDir(), "images")
	if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images}); err != nil {
		t.Fatal(err)
	}
	last := out.ints(t)
	// With the masks external and /dev/shm a bind, CRIU tars /dev only.
	if tars, _ := filepath.Glob(filepath.Join(images, "tmpfs-dev-*")); len(tars) != 1 {
		t.Errorf("want the tmpfs of /dev only in the images, got %d: %v", len(tars), tars)
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
	var st unix.Statfs_t
	for _, d := range dirs {
		if err := unix.Statfs(filepath.Join(cg, d), &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			t.Errorf("restored /sys/fs/cgroup/%s: statfs type %#x, %v; want a cgroup mount", d, st.Type, err)
		}
	}
	if err := unix.Statfs(cg, &st); err != nil || st.Flags&unix.ST_RDONLY == 0 {
		t.Errorf("restored /sys/fs/cgroup: flags %#x %v, want read-only", st.Flags, err)
	}
	if err := r.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
}

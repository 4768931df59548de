package runc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/edgehop/edgehop/internal/linux"
)

// cgroupKey is the CRIU external-mount key of a container's /sys/fs/cgroup
// tmpfs (ExternalCgroupFS).
const cgroupKey = "edgehop-cgroupfs"

// ExternalCgroupFS is CRIU configuration that keeps a container's
// /sys/fs/cgroup tmpfs out of the images. On a cgroup v1 host runc mounts
// a tmpfs there holding only a directory per hierarchy (each the mount
// point of a bind of the container's cgroup) and, for hierarchies that
// join controllers, a symlink per controller; CRIU dumps it with tar and
// gzip and restores it with tar, 4-5 ms a side here, inside the frozen
// window. Marked external, it is bound on restore to dir, a read-only
// tmpfs holding the same entries (MountCgroupSkeleton), on which CRIU
// mounts the hierarchies' binds again.
func ExternalCgroupFS(dir string) string {
	return fmt.Sprintf("external mnt[/sys/fs/cgroup]:%s\nexternal mnt[%s]:%s\n", cgroupKey, cgroupKey, dir)
}

// CgroupSkeleton lists what runc puts in a container's /sys/fs/cgroup
// tmpfs on this host (runc 1.1's mountCgroupV1): a directory per cgroup v1
// hierarchy mounted here, named after its mount point, and for a
// hierarchy of several controllers ("cpu,cpuacct") a symlink per
// controller to it. dirs is sorted; both are empty on a cgroup v2 host,
// where runc mounts cgroup2 instead of a tmpfs.
func CgroupSkeleton() (dirs []string, links map[string]string, err error) {
	mounts, err := linux.MountsOfType("cgroup")
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	links = map[string]string{}
	for _, m := range mounts {
		base := filepath.Base(m.Point)
		if seen[base] {
			continue
		}
		seen[base] = true
		dirs = append(dirs, base)
		if strings.Contains(base, ",") {
			for _, ss := range strings.Split(base, ",") {
				links[ss] = base
			}
		}
	}
	sort.Strings(dirs)
	return dirs, links, nil
}

// MountCgroupSkeleton mounts at target (created if missing) a read-only
// tmpfs holding CgroupSkeleton's entries, for ExternalCgroupFS. It reports
// false, mounting nothing, on a host without cgroup v1 hierarchies.
func MountCgroupSkeleton(target string) (bool, error) {
	dirs, links, err := CgroupSkeleton()
	if err != nil || len(dirs) == 0 {
		return false, err
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return false, err
	}
	fill := func() error {
		for _, d := range dirs {
			if err := os.Mkdir(filepath.Join(target, d), 0o755); err != nil {
				return err
			}
		}
		for name, to := range links {
			if err := os.Symlink(to, filepath.Join(target, name)); err != nil && !os.IsExist(err) {
				return err
			}
		}
		return nil
	}
	if err := linux.MountTmpfsReadOnly(target, "size=64k,mode=755", fill); err != nil {
		return false, fmt.Errorf("cgroup skeleton at %s: %w", target, err)
	}
	return true, nil
}

// devNode is a device node runc creates in a container's /dev.
type devNode struct {
	name         string
	major, minor uint32
}

// defaultDevices are the nodes runc 1.1 creates in every container's /dev
// (libcontainer/specconv's AllowedDevices that it makes), each mode 0666
// and owned by root.
var defaultDevices = []devNode{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"tty", 5, 0}, {"random", 1, 8}, {"urandom", 1, 9},
}

// devLinks are the symlinks runc makes in /dev (setupPtmx,
// setupDevSymlinks).
var devLinks = map[string]string{
	"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	"core": "/proc/kcore", "ptmx": "pts/ptmx",
}

// MakeDevDir fills dir (created if missing, mode 0755) with what runc puts
// in a container's /dev when it is a tmpfs: the default device nodes, the
// /proc and pts symlinks, and the mount points of /dev/pts, /dev/shm and
// /dev/mqueue. With Spec.DevDir set to it, runc binds it at /dev as it is
// (and creates nothing there), and CRIU leaves it out of the images. Its
// file system must allow device nodes (DevicesAllowed).
func MakeDevDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"pts", "shm", "mqueue"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil && !os.IsExist(err) {
			return err
		}
	}
	for _, n := range defaultDevices {
		p := filepath.Join(dir, n.name)
		if err := linux.Mknod(p, fs.ModeDevice|fs.ModeCharDevice, 0o666, n.major, n.minor); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := os.Chmod(p, 0o666); err != nil { // past the umask
			return err
		}
	}
	for name, to := range devLinks {
		if name == "core" {
			// Only where the kernel has /proc/kcore, as runc does.
			if _, err := os.Stat("/proc/kcore"); err != nil {
				continue
			}
		}
		if err := os.Symlink(to, filepath.Join(dir, name)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

// DevicesAllowed reports whether device nodes work on the file system
// holding path (it is not mounted nodev).
func DevicesAllowed(path string) (bool, error) {
	st, err := linux.StatFileSystem(path)
	if err != nil {
		return false, err
	}
	return !st.NoDev, nil
}

// CgroupV1 is a node's cgroup v1 hierarchies that runc manages, for
// restores that start runc in the container's cgroups
// (RestoreOpts.Cgroups). runc 1.1 restores a container's cgroup mount
// as binds of the cgroups the restoring runc process is in (it reads
// /proc/self/cgroup): started in the agent's, it gave a migrated
// container the agent's memory cgroup and the other hierarchies' roots.
type CgroupV1 struct {
	// Hierarchies maps each hierarchy's directory name under
	// /sys/fs/cgroup ("memory", "cpu,cpuacct", "systemd") to its host
	// mount point.
	Hierarchies map[string]string
}

// runcV1Controllers are the cgroup v1 controllers runc 1.1's cgroup
// manager makes a container's cgroup in ("systemd" is the name=systemd
// hierarchy's directory).
var runcV1Controllers = map[string]bool{
	"cpuset": true, "devices": true, "memory": true, "cpu": true, "cpuacct": true, "pids": true, "blkio": true,
	"hugetlb": true, "net_cls": true, "net_prio": true, "perf_event": true, "freezer": true, "rdma": true, "systemd": true,
}

// LoadCgroupV1 reads this host's cgroup v1 hierarchies whose controllers
// runc manages. It returns nil on a host without them, or where one is
// mounted from below its root (a cgroup namespace): runc's view of its
// own cgroups is then not the container's path.
func LoadCgroupV1() (*CgroupV1, error) {
	mounts, err := linux.MountsOfType("cgroup")
	if err != nil {
		return nil, err
	}
	c := &CgroupV1{Hierarchies: map[string]string{}}
	for _, m := range mounts {
		dir := filepath.Base(m.Point)
		managed := false
		for _, ctrl := range strings.Split(dir, ",") {
			managed = managed || runcV1Controllers[ctrl]
		}
		if !managed {
			continue
		}
		if m.Root != "/" {
			return nil, nil
		}
		if _, seen := c.Hierarchies[dir]; !seen {
			c.Hierarchies[dir] = m.Point
		}
	}
	if len(c.Hierarchies) == 0 {
		return nil, nil
	}
	return c, nil
}

// CgroupDir is a cgroup of one cgroup v1 hierarchy: the hierarchy's
// name (its directory under /sys/fs/cgroup, as /proc/PID/cgroup names
// it without "name="), its host mount point, and the cgroup's path
// below it.
type CgroupDir struct{ Hierarchy, Point, Path string }

// Dir is the cgroup's directory on the host.
func (d CgroupDir) Dir() string { return filepath.Join(d.Point, d.Path) }

// Dirs are the container's cgroups at cgroupsPath, one per hierarchy,
// sorted by hierarchy.
func (c *CgroupV1) Dirs(cgroupsPath string) []CgroupDir {
	out := make([]CgroupDir, 0, len(c.Hierarchies))
	for h, point := range c.Hierarchies {
		out = append(out, CgroupDir{Hierarchy: h, Point: point, Path: cgroupsPath})
	}
	slices.SortFunc(out, func(a, b CgroupDir) int { return strings.Compare(a.Hierarchy, b.Hierarchy) })
	return out
}

// Make creates the container's cgroups at cgroupsPath, as runc's cgroup
// manager would: a new cpuset cgroup gets its parent's CPUs and memory
// nodes (without, no task may join it).
func (c *CgroupV1) Make(cgroupsPath string) error {
	for dir, point := range c.Hierarchies {
		p := point
		for _, part := range strings.Split(strings.Trim(filepath.Clean(cgroupsPath), "/"), "/") {
			parent := p
			p = filepath.Join(p, part)
			err := os.Mkdir(p, 0o755)
			if errors.Is(err, os.ErrExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("cgroup: %w", err)
			}
			if slices.Contains(strings.Split(dir, ","), "cpuset") {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					b, err := os.ReadFile(filepath.Join(parent, f))
					if err == nil {
						err = os.WriteFile(filepath.Join(p, f), b, 0)
					}
					if err != nil {
						return fmt.Errorf("cgroup %s: %w", p, err)
					}
				}
			}
		}
	}
	return nil
}

// Remove removes the container's cgroups that are left (runc removes its
// own when it deletes the container; a restore that failed before runc
// made its state leaves those Make made). A cgroup still holding tasks is
// an error.
func (c *CgroupV1) Remove(cgroupsPath string) error {
	var errs []error
	for _, d := range c.Dirs(cgroupsPath) {
		if err := os.Remove(d.Dir()); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

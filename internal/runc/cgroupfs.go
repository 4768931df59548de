package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

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
	points, err := linux.MountPointsOfType("cgroup")
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	links = map[string]string{}
	for _, p := range points {
		base := filepath.Base(p)
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
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", target, "tmpfs", flags, "size=64k,mode=755"); err != nil {
		return false, fmt.Errorf("mount tmpfs at %s: %w", target, err)
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
		return unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, "")
	}
	if err := fill(); err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
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
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mknod %s: %w", p, err)
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
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return st.Flags&unix.ST_NODEV == 0, nil
}

// CgroupV1 is a node's cgroup v1 layout for containers whose
// /sys/fs/cgroup is made of bind mounts (Spec.CgroupV1) rather than runc's
// cgroup mount. runc 1.1 restores a container's cgroup mount by binding
// the hierarchies' cgroups of the restoring runc process itself (it reads
// /proc/self/cgroup), so a migrated container saw the agent's cgroups, or
// the hierarchies' roots, instead of its own. Binds name the container's
// own cgroups on every node, and runc maps them on restore as it maps
// every bind mount.
type CgroupV1 struct {
	// Skeleton is MountCgroupSkeleton's directory, bound read-only at
	// /sys/fs/cgroup.
	Skeleton string
	// Hierarchies maps the skeleton's directories whose controllers runc
	// manages (it makes the container's cgroup in each) to the host's
	// mount point of the hierarchy.
	Hierarchies map[string]string
}

// runcV1Controllers are the cgroup v1 controllers runc 1.1's cgroup
// manager makes a container's cgroup in ("systemd" is the name=systemd
// hierarchy's directory).
var runcV1Controllers = map[string]bool{
	"cpuset": true, "devices": true, "memory": true, "cpu": true, "cpuacct": true, "pids": true, "blkio": true,
	"hugetlb": true, "net_cls": true, "net_prio": true, "perf_event": true, "freezer": true, "rdma": true, "systemd": true,
}

// LoadCgroupV1 reads this host's cgroup v1 hierarchies for containers
// bound on skeleton (MountCgroupSkeleton's directory). It returns nil on
// a host without them, or where a hierarchy is mounted from below its
// root (a cgroup namespace): such hosts keep runc's cgroup mount.
func LoadCgroupV1(skeleton string) (*CgroupV1, error) {
	roots, err := linux.MountRootsOfType("cgroup")
	if err != nil {
		return nil, err
	}
	c := &CgroupV1{Skeleton: skeleton, Hierarchies: map[string]string{}}
	for point, root := range roots {
		if strings.HasPrefix(point, skeleton+"/") {
			continue // a container's, not the host's
		}
		if root != "/" {
			return nil, nil
		}
		dir := filepath.Base(point)
		if _, seen := c.Hierarchies[dir]; seen {
			continue
		}
		managed := false
		for _, ctrl := range strings.Split(dir, ",") {
			managed = managed || runcV1Controllers[ctrl]
		}
		if managed {
			c.Hierarchies[dir] = point
		}
	}
	if len(c.Hierarchies) == 0 {
		return nil, nil
	}
	return c, nil
}

// mounts are the mounts of a container's /sys/fs/cgroup whose cgroups
// are at cgroupsPath in every hierarchy: the skeleton, and on each of its
// directories the container's cgroup, all read-only as runc mounts them.
func (c *CgroupV1) mounts(cgroupsPath string) []specs.Mount {
	opts := []string{"bind", "ro", "nosuid", "noexec", "nodev"}
	ms := []specs.Mount{{Destination: "/sys/fs/cgroup", Type: "bind", Source: c.Skeleton, Options: opts}}
	dirs := make([]string, 0, len(c.Hierarchies))
	for d := range c.Hierarchies {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		ms = append(ms, specs.Mount{Destination: "/sys/fs/cgroup/" + d, Type: "bind",
			Source: filepath.Join(c.Hierarchies[d], cgroupsPath), Options: opts})
	}
	return ms
}

// Make creates the container's cgroup at cgroupsPath in each hierarchy.
// runc makes them only once CRIU runs, and a restore binds them before:
// they must be there first.
func (c *CgroupV1) Make(cgroupsPath string) error {
	for _, point := range c.Hierarchies {
		if err := os.MkdirAll(filepath.Join(point, cgroupsPath), 0o755); err != nil {
			return fmt.Errorf("cgroup: %w", err)
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
	for _, point := range c.Hierarchies {
		if err := os.Remove(filepath.Join(point, cgroupsPath)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

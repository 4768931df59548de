package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

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

package linux

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MountOverlay mounts an overlay filesystem at target with a read-only
// lower layer and a writable upper layer (work is overlayfs' scratch dir).
// It is mounted nosuid and nodev: the container's root user is the
// host's (no user namespace), and neither a setuid file nor a device node
// it makes in its root file system may work there. (Its /dev is a mount of
// its own, a tmpfs or a bind, where device nodes do work.) Missing
// directories are made: upper 0755, as it is the container's / (overlayfs
// shows the upper root's mode there), work 0700; the caller keeps their
// parent unreachable by other users, as upper lies on the host's file
// system.
func MountOverlay(lower, upper, work, target string) error {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{upper, 0o755}, {work, 0o700}, {target, 0o755}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", target, err)
	}
	return nil
}

// IsMountPoint reports whether path is listed in /proc/self/mountinfo.
func IsMountPoint(path string) bool {
	ms, err := MountsUnder(path)
	if err != nil {
		return false
	}
	for _, m := range ms {
		if m == path {
			return true
		}
	}
	return false
}

// MountEmptyReadOnly mounts an empty tmpfs at target (created if
// missing) whose superblock is read-only: nothing can ever be written
// through it or through any bind mount of it, whatever that bind's own
// flags.
func MountEmptyReadOnly(target string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	flags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("tmpfs", target, "tmpfs", flags, "size=4k,mode=0555"); err != nil {
		return fmt.Errorf("mount read-only tmpfs at %s: %w", target, err)
	}
	return nil
}

// MountTmpfs mounts a tmpfs at target (created if missing), limited to
// sizeMB megabytes (0: the kernel's default, half of memory).
func MountTmpfs(target string, sizeMB int) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	opts := "mode=0700"
	if sizeMB > 0 {
		opts += fmt.Sprintf(",size=%dm", sizeMB)
	}
	if err := unix.Mount("tmpfs", target, "tmpfs", 0, opts); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", target, err)
	}
	return nil
}

// MountTmpfsReadOnly mounts a tmpfs at target (which must exist) with
// opts, nosuid, nodev and noexec, runs fill to write its content, then
// makes it read-only. Should fill or the remount fail, the tmpfs is
// detached again and their error returned.
func MountTmpfsReadOnly(target, opts string, fill func() error) error {
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", target, "tmpfs", flags, opts); err != nil {
		return fmt.Errorf("mount tmpfs at %s: %w", target, err)
	}
	err := fill()
	if err == nil {
		err = unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, "")
	}
	if err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		return err
	}
	return nil
}

// File system magics (statfs(2) f_type) of FileSystem.Type.
const (
	TmpfsMagic  = unix.TMPFS_MAGIC
	CgroupMagic = unix.CGROUP_SUPER_MAGIC
)

// FileSystem is what statfs(2) says of the file system holding a path.
type FileSystem struct {
	Type     int64 // its magic: TmpfsMagic, CgroupMagic, …
	ReadOnly bool  // mounted read-only (ST_RDONLY)
	NoDev    bool  // mounted nodev: device nodes do not work (ST_NODEV)
	// Avail is the bytes free for unprivileged users (f_bavail × f_bsize).
	Avail uint64
	Size  uint64 // the bytes it holds in all (f_blocks × f_bsize)
}

// StatFileSystem describes the file system holding path. The error is
// statfs's bare errno.
func StatFileSystem(path string) (FileSystem, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FileSystem{}, err
	}
	return FileSystem{
		Type:     st.Type,
		ReadOnly: st.Flags&unix.ST_RDONLY != 0,
		NoDev:    st.Flags&unix.ST_NODEV != 0,
		Avail:    st.Bavail * uint64(st.Bsize),
		Size:     st.Blocks * uint64(st.Bsize),
	}, nil
}

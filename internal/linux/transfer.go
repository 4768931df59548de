package linux

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// This file holds the file-system calls package transfer needs to copy a
// tree with full fidelity (an overlayfs upper layer): special files,
// extended attributes and symlink times.

// DeviceNumbers splits a stat st_rdev into its major and minor numbers.
func DeviceNumbers(rdev uint64) (major, minor uint32) {
	return unix.Major(rdev), unix.Minor(rdev)
}

// Mknod creates a special file at path: typ is fs.ModeDevice|
// fs.ModeCharDevice (character device), fs.ModeDevice (block device),
// fs.ModeNamedPipe or fs.ModeSocket. perm is subject to the umask; callers
// that care chmod afterwards. Device nodes need CAP_MKNOD (the overlayfs
// whiteout, a character device 0:0, too).
func Mknod(path string, typ fs.FileMode, perm fs.FileMode, major, minor uint32) error {
	var mode uint32
	switch typ {
	case fs.ModeDevice | fs.ModeCharDevice:
		mode = unix.S_IFCHR
	case fs.ModeDevice:
		mode = unix.S_IFBLK
	case fs.ModeNamedPipe:
		mode = unix.S_IFIFO
	case fs.ModeSocket:
		mode = unix.S_IFSOCK
	default:
		return fmt.Errorf("mknod %s: unsupported file type %v", path, typ)
	}
	mode |= uint32(perm.Perm())
	if err := unix.Mknod(path, mode, int(unix.Mkdev(major, minor))); err != nil {
		return &os.PathError{Op: "mknod", Path: path, Err: err}
	}
	return nil
}

// Lxattrs returns the extended attributes of path (a symlink itself, not
// its target) whose names keep accepts. A file system without extended
// attributes gives an empty map. Attributes the caller may not read are
// not listed by the kernel (trusted.* needs CAP_SYS_ADMIN).
func Lxattrs(path string, keep func(name string) bool) (map[string][]byte, error) {
	names, err := llistxattr(path)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, &os.PathError{Op: "llistxattr", Path: path, Err: err}
	}
	var out map[string][]byte
	for _, name := range names {
		if !keep(name) {
			continue
		}
		v, err := lgetxattr(path, name)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, &os.PathError{Op: "lgetxattr " + name, Path: path, Err: err}
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[name] = v
	}
	return out, nil
}

// Lsetxattr sets the extended attribute name of path (a symlink itself,
// not its target) to value.
func Lsetxattr(path, name string, value []byte) error {
	if err := unix.Lsetxattr(path, name, value, 0); err != nil {
		return &os.PathError{Op: "lsetxattr " + name, Path: path, Err: err}
	}
	return nil
}

// Lutimes sets the access and modification times of path without
// following a symlink.
func Lutimes(path string, atime, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: path, Err: err}
	}
	return nil
}

// llistxattr returns the attribute names of path, retrying when the list
// grows between sizing and reading it.
func llistxattr(path string) ([]string, error) {
	for {
		n, err := unix.Llistxattr(path, nil)
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

// lgetxattr returns one attribute's value, retrying when it grows between
// sizing and reading it.
func lgetxattr(path, name string) ([]byte, error) {
	for {
		n, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		if n == 0 {
			return buf, nil
		}
		n, err = unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// SetTCPUserTimeout bounds how long data the connection sent may stay
// unacknowledged (TCP_USER_TIMEOUT) before the kernel gives the connection
// up: a dead peer or a cut link fails reads and writes then, instead of
// after the kernel's retransmission limit (about 15 minutes).
func SetTCPUserTimeout(c syscallConn, d time.Duration) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("TCP_USER_TIMEOUT: %w", serr)
	}
	return nil
}

// syscallConn is a connection with a file descriptor (*net.TCPConn).
type syscallConn interface {
	SyscallConn() (syscall.RawConn, error)
}

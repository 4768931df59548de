package linux

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// EndTCPRepair takes every TCP socket of the processes in the cgroup at
// path (relative to each hierarchy's root) out of repair mode, and returns
// how many were in it.
//
// CRIU puts a service's established connections in repair mode for a
// dump and takes them out again when the dump fails, except after a
// lazy-pages dump whose page server failed: it then resumes the service
// without leaving repair mode (cr_dump_finish unlocks the network only
// before serving the lazy pages), and each connection, unable to send or
// acknowledge, is lost. This does the step CRIU skipped, from outside:
// each socket is taken with pidfd_getfd, found in repair mode (setting its
// repair queue, which the kernel allows only then) and set out of it,
// which sends a window probe, as CRIU does. Sockets in normal mode are not
// touched.
func EndTCPRepair(path string) (int, error) {
	b, err := os.ReadFile(cgroupFile(path, "cgroup.procs", "cgroup.procs"))
	if err != nil {
		return 0, fmt.Errorf("end tcp repair: %w", err)
	}
	seen := map[uint64]bool{}
	n := 0
	var errs []error
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		k, err := endTCPRepairOf(pid, seen)
		n += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// endTCPRepairOf is EndTCPRepair for one process; seen holds the socket
// inodes already handled (a forked server shares them).
func endTCPRepairOf(pid int, seen map[uint64]bool) (int, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return 0, nil // gone
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, nil // gone
	}
	defer unix.Close(pidfd)
	n := 0
	var errs []error
	for _, e := range ents {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
		if err != nil || seen[ino] {
			continue
		}
		seen[ino] = true
		target, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, target, 0)
		if err != nil {
			continue // closed meanwhile
		}
		ended, err := endRepair(fd)
		unix.Close(fd)
		if err != nil {
			errs = append(errs, fmt.Errorf("pid %d fd %d: %w", pid, target, err))
		}
		if ended {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// tcpNoQueue is linux/tcp.h's TCP_NO_QUEUE.
const tcpNoQueue = 0

// endRepair takes the socket fd out of repair mode if it is a TCP socket
// in it.
func endRepair(fd int) (bool, error) {
	if p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || p != unix.IPPROTO_TCP {
		return false, nil
	}
	// TCP_REPAIR_QUEUE may be set only in repair mode; TCP_NO_QUEUE is
	// what CRIU leaves it at.
	if err := unix.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_REPAIR_QUEUE, tcpNoQueue); err != nil {
		return false, nil // not in repair mode
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF); err != nil {
		return false, fmt.Errorf("tcp repair off: %w", err)
	}
	return true, nil
}

package linux

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// SetChildSubreaper makes the calling process adopt (and so be able to
// reap) orphaned descendants instead of init.
func SetChildSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl child subreaper: %w", err)
	}
	return nil
}

// FindProcesses lists the processes whose command line (argv) match
// accepts. Processes that exit while being read are skipped.
func FindProcesses(match func(argv []string) bool) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(b) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Kill sends SIGKILL to pid; a process already gone is not an error.
func Kill(pid int) error {
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	return nil
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

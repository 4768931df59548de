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

// PassiveOpens is the count of TCP connections the network namespace of
// process pid has accepted (the Tcp PassiveOpens counter of its
// /proc/PID/net/snmp).
func PassiveOpens(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/snmp", pid))
	if err != nil {
		return 0, err
	}
	return snmpField(string(b), "Tcp", "PassiveOpens")
}

// snmpField reads one counter of /proc/net/snmp's "Proto: names" and
// "Proto: values" line pairs.
func snmpField(text, proto, field string) (int64, error) {
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, ok1 := strings.CutPrefix(lines[i], proto+":")
		values, ok2 := strings.CutPrefix(lines[i+1], proto+":")
		if !ok1 || !ok2 {
			continue
		}
		n, v := strings.Fields(names), strings.Fields(values)
		for k := range n {
			if n[k] == field && k < len(v) {
				return strconv.ParseInt(v[k], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s %s in snmp counters", proto, field)
}

// Gettid returns the calling thread's id.
func Gettid() int { return unix.Gettid() }

// Nice returns the calling process's nice value (getpriority(2) of
// PRIO_PROCESS 0, whose kernel result is 20 - nice).
func Nice() (int, error) {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		return 0, err
	}
	return 20 - prio, nil
}

// SetGroupNice sets the nice value of every process of process group
// pgid (setpriority(2) PRIO_PGRP).
func SetGroupNice(pgid, nice int) error { return unix.Setpriority(unix.PRIO_PGRP, pgid, nice) }

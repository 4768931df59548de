package linux

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// capSysResource is CAP_SYS_RESOURCE's bit in the capability sets.
const capSysResource = 24

// HasCapSysResource reports whether this process holds CAP_SYS_RESOURCE
// in its effective set: without it, prlimit on another user's process
// fails, and CRIU cannot dump that process's rlimits.
func HasCapSysResource() (bool, error) {
	v, err := statusField(os.Getpid(), "CapEff")
	if err != nil {
		return false, err
	}
	caps, err := strconv.ParseUint(v, 16, 64)
	if err != nil {
		return false, fmt.Errorf("CapEff %q: %w", v, err)
	}
	return caps&(1<<capSysResource) != 0, nil
}

// ProcessUIDs returns the real, effective and saved user ids of pid.
func ProcessUIDs(pid int) ([3]int, error) { return processIDs(pid, "Uid") }

// ProcessGIDs returns the real, effective and saved group ids of pid.
func ProcessGIDs(pid int) ([3]int, error) { return processIDs(pid, "Gid") }

func processIDs(pid int, key string) ([3]int, error) {
	var out [3]int
	v, err := statusField(pid, key)
	if err != nil {
		return out, err
	}
	f := strings.Fields(v)
	if len(f) < 3 {
		return out, fmt.Errorf("%s line %q of %d", key, v, pid)
	}
	for i := range out {
		if out[i], err = strconv.Atoi(f[i]); err != nil {
			return out, fmt.Errorf("%s line %q of %d: %w", key, v, pid, err)
		}
	}
	return out, nil
}

// ProcessTree returns pid and all its descendants.
func ProcessTree(pid int) ([]int, error) {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		kids, err := ChildPIDs(out[i])
		if err != nil {
			if i == 0 {
				return nil, err
			}
			continue // exited meanwhile
		}
		out = append(out, kids...)
	}
	return out, nil
}

func statusField(pid int, key string) (string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("/proc/%d/status has no %s line", pid, key)
}

package runc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Host settings that lengthen every CRIU dump and restore, measured on
// the kind of machine edgehop targets (see README, "What setup changes").
const (
	// RCUExpeditedPath: CRIU mounts and detaches a cgroup hierarchy per
	// controller and a private copy of every tmpfs it dumps or restores;
	// each detach waits for an RCU grace period, tens of milliseconds per
	// dump in all. Expedited grace periods take microseconds.
	RCUExpeditedPath = "/sys/kernel/rcu_expedited"
	// ConntrackBucketsPath: CRIU dumps the conntrack table of the
	// container's network namespace twice (entries and expectations)
	// even when that namespace is external, and the kernel walks the
	// whole host-wide hash for each.
	ConntrackBucketsPath = "/proc/sys/net/netfilter/nf_conntrack_buckets"
	// MaxConntrackBuckets is the largest hash that costs little: 16384
	// buckets walk in well under a millisecond.
	MaxConntrackBuckets = 16384
)

// FrozenWindowHints returns, for each host setting that makes CRIU's
// dump or restore slower than it needs to be, what is wrong and the fix.
// Settings that cannot be read are skipped.
func FrozenWindowHints() []string {
	return frozenWindowHints(RCUExpeditedPath, ConntrackBucketsPath)
}

func frozenWindowHints(rcuPath, ctPath string) []string {
	var hints []string
	if v, ok := readInt(rcuPath); ok && v == 0 {
		hints = append(hints, fmt.Sprintf("%s is 0: every mount CRIU detaches waits for a full RCU grace period (tens of ms of downtime per migration); echo 1 > %s (make setup does)", rcuPath, rcuPath))
	}
	if v, ok := readInt(ctPath); ok && v > MaxConntrackBuckets {
		hints = append(hints, fmt.Sprintf("%s is %d: CRIU walks the whole conntrack hash twice per dump (about 9 ms each at 262144); echo %d > %s (make setup does)", ctPath, v, MaxConntrackBuckets, ctPath))
	}
	return hints
}

func readInt(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return v, err == nil
}

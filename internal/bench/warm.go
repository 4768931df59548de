package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// WarmMemory touches n bytes of fresh anonymous memory once, page by
// page, and gives it back. On a virtual machine whose memory the host
// backs only on first touch (this project's machines: about 3 s per GiB
// the first time, then memory speed), whichever migration first needs
// that much memory — for its images, its store or the restored process —
// would otherwise pay the host's cost, and the benchmark would compare
// the machine's history rather than the strategies. It returns how long
// the touching took.
func WarmMemory(n int64) (time.Duration, error) {
	start := time.Now()
	const chunk = 256 << 20
	page := int64(os.Getpagesize())
	for done := int64(0); done < n; done += chunk {
		size := min(chunk, n-done)
		b, err := linux.MapAnonymous(int(size))
		if err != nil {
			return time.Since(start), fmt.Errorf("warm memory: %w", err)
		}
		for i := int64(0); i < size; i += page {
			b[i] = 1
		}
		if err := linux.Unmap(b); err != nil {
			return time.Since(start), fmt.Errorf("warm memory: %w", err)
		}
	}
	return time.Since(start), nil
}

// WarmBytes is how much WarmMemory should touch for a benchmark whose
// largest service holds stateBytes: the service, its images on both
// nodes, the destination's pre-copy store and the restored copy, plus
// 1 GiB, at most half of the machine's memory.
func WarmBytes(stateBytes int64) int64 {
	want := 4*stateBytes + 1<<30
	if total := memTotal(); total > 0 && want > total/2 {
		want = total / 2
	}
	return want
}

// memTotal reads MemTotal from /proc/meminfo; 0 when unknown.
func memTotal() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

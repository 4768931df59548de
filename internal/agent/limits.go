package agent

import (
	"fmt"
	"math"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
)

// Every container runs under cgroup limits of memory, tasks and CPU
// (`edgehop run --memory --pids --cpus`); a request that gives none gets
// these. 2 GiB holds every service the benchmarks run (DPRGen's 1.2 GB,
// Redis's 640 MB dataset) while no one service can take an edge node's
// memory and have its agent OOM-killed; 4096 tasks stop a fork bomb and
// leave a web server's workers room. CPU has no quota by default: a
// quota throttles a service that the node's idle cores could serve, and
// the scheduler already shares the busy ones.
const (
	DefaultMemoryLimit = 2 << 30
	DefaultPidsLimit   = 4096
	// minMemoryLimit is the least a container may be given: runc, CRIU's
	// restore and a shell fit in it.
	minMemoryLimit = 4 << 20
	minPidsLimit   = 8
	// maxCPUMillis bounds --cpus (1024 CPUs).
	maxCPUMillis = 1024 * 1000
)

// limitsFor turns a run request's limits into a Process's, with the
// defaults for those it does not give.
func limitsFor(r api.RunRequest) (mem, pids, cpuMillis int64, err error) {
	mem, pids = r.Memory, r.Pids
	if mem == 0 {
		mem = DefaultMemoryLimit
	}
	if pids == 0 {
		pids = DefaultPidsLimit
	}
	switch {
	case r.CPUs < 0 || math.IsNaN(r.CPUs) || r.CPUs*1000 > maxCPUMillis:
		return 0, 0, 0, fmt.Errorf("cpus %v: want a positive number of CPUs (1.5: one and a half), at most %d", r.CPUs, maxCPUMillis/1000)
	case r.CPUs > 0:
		cpuMillis = max(int64(math.Round(r.CPUs*1000)), 10)
	}
	p := migration.Process{MemoryLimit: mem, PidsLimit: pids, CPUMillis: cpuMillis}
	return mem, pids, cpuMillis, checkLimits(p)
}

// checkLimits checks a Process's cgroup limits (0: none).
func checkLimits(p migration.Process) error {
	if p.MemoryLimit != 0 && p.MemoryLimit < minMemoryLimit {
		return fmt.Errorf("memory limit %d bytes: want at least %d MiB", p.MemoryLimit, minMemoryLimit>>20)
	}
	if p.PidsLimit != 0 && (p.PidsLimit < minPidsLimit || p.PidsLimit > math.MaxInt32) {
		return fmt.Errorf("pids limit %d: want %d to %d", p.PidsLimit, minPidsLimit, math.MaxInt32)
	}
	if p.CPUMillis != 0 && (p.CPUMillis < 10 || p.CPUMillis > maxCPUMillis) {
		return fmt.Errorf("cpu quota of %d millicpus: want 10 (0.01 CPUs) to %d", p.CPUMillis, maxCPUMillis)
	}
	return nil
}

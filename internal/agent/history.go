package agent

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/runc"
)

// dumpStatsMap flattens CRIU's dump statistics with the names the model
// package reads (times in microseconds, as CRIU records them).
func dumpStatsMap(s runc.DumpStats) map[string]float64 {
	return map[string]float64{
		"freezing_time_us":     float64(s.FreezingTime.Microseconds()),
		"frozen_time_us":       float64(s.FrozenTime.Microseconds()),
		"memdump_time_us":      float64(s.MemdumpTime.Microseconds()),
		"memwrite_time_us":     float64(s.MemwriteTime.Microseconds()),
		"pages_scanned":        float64(s.PagesScanned),
		"pages_written":        float64(s.PagesWritten),
		"pages_skipped_parent": float64(s.PagesSkippedParent),
		"pages_lazy":           float64(s.PagesLazy),
	}
}

func restoreStatsMap(s runc.RestoreStats) map[string]float64 {
	return map[string]float64{
		"restore_time_us": float64(s.RestoreTime.Microseconds()),
		"forking_time_us": float64(s.ForkingTime.Microseconds()),
		"pages_restored":  float64(s.PagesRestored),
		"pages_compared":  float64(s.PagesCompared),
	}
}

// recordHistory appends a migration result to the node's history file.
func (a *Agent) recordHistory(r migration.Result) {
	f, err := os.OpenFile(filepath.Join(a.cfg.StateDir, "migrations.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		a.log.Warn("record migration", "err", err)
		return
	}
	defer f.Close()
	b, _ := json.Marshal(r)
	_, _ = f.Write(append(b, '\n'))
}

package bench

import (
	"testing"

	"github.com/edgehop/edgehop/internal/migration"
)

func TestFrozenWindow(t *testing.T) {
	run := func(ok bool, dump, transfer, restore, network, frozenUs, restoreUs float64) Migration {
		return Migration{OK: ok, PhasesMs: map[string]float64{"dump": dump, "transfer": transfer, "restore": restore, "network": network},
			CRIU: map[string]float64{"frozen_time_us": frozenUs, "restore_time_us": restoreUs}}
	}
	runs := []Migration{
		run(true, 40, 8, 50, 6, 18000, 17000),
		run(true, 44, 10, 56, 7, 20000, 19000),
		run(true, 36, 6, 44, 5, 16000, 15000),
		run(false, 900, 900, 900, 900, 900000, 900000),        // failed: not counted
		{OK: true, PhasesMs: map[string]float64{"dump": 500}}, // lazy: no CRIU stats
	}
	want := map[string]float64{"dump: CRIU": 18, "dump: the rest": 22, "transfer": 8, "restore: CRIU": 17, "restore: the rest": 33, "network": 6}
	checkParts(t, frozenWindow(runs), want)
	if frozenWindow(runs[3:]) != nil {
		t.Error("a window from runs without CRIU's statistics")
	}
	// With the destination's account, its runc is apart from the rest.
	for i, ms := range []float64{25, 30, 20} {
		runs[i].Restore = &migration.RestoreReport{RestoreMs: ms}
	}
	want = map[string]float64{"dump: CRIU": 18, "dump: the rest": 22, "transfer": 8, "restore: CRIU": 17, "restore: runc": 8,
		"restore: the rest": 25, "network": 6}
	checkParts(t, frozenWindow(runs), want)
}

// The lazy strategies' window: the dump is one part (CRIU has no
// statistics for it until the pages are served), the restore split as for
// the others.
func TestLazyWindow(t *testing.T) {
	run := func(dump, transfer, restore, network, restoreUs, destMs float64) Migration {
		return Migration{OK: true, PhasesMs: map[string]float64{"dump": dump, "transfer": transfer, "restore": restore, "network": network, "lazy": 5},
			CRIU: map[string]float64{"restore_time_us": restoreUs}, Restore: &migration.RestoreReport{RestoreMs: destMs}}
	}
	runs := []Migration{
		run(20, 2, 34, 6, 12000, 18),
		run(22, 3, 38, 7, 13000, 20),
		run(18, 1, 30, 5, 11000, 16),
		{OK: true, PhasesMs: map[string]float64{"dump": 500, "lazy": 5}}, // no restore statistics: not counted
		{OK: true, PhasesMs: map[string]float64{"dump": 500}, CRIU: map[string]float64{"restore_time_us": 1}, // not lazy
			Restore: &migration.RestoreReport{RestoreMs: 2}},
	}
	want := map[string]float64{"dump: CRIU's lazy dump": 20, "transfer": 2, "restore: CRIU": 12, "restore: runc": 6, "restore: the rest": 16, "network": 6}
	checkParts(t, frozenWindow(runs), want)
	if frozenWindow(runs[3:]) != nil {
		t.Error("a window from runs without the statistics it splits by")
	}
}

// checkParts fails t unless parts are exactly want's, each with its median
// and a reason.
func checkParts(t *testing.T, parts []WindowPart, want map[string]float64) {
	t.Helper()
	if len(parts) != len(want) {
		t.Fatalf("parts %+v", parts)
	}
	for _, p := range parts {
		if w, ok := want[p.Part]; !ok || p.P50Ms != w || p.What == "" {
			t.Errorf("%s = %.1f (%q), want %.1f and a reason", p.Part, p.P50Ms, p.What, w)
		}
	}
}

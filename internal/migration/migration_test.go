package migration

import (
	"testing"
	"time"
)

func TestTimerPhasesAndDowntime(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	tm := NewTimer(clock)
	now = now.Add(40 * time.Millisecond)
	tm.Mark(PhasePrepare)
	tm.Freeze()
	now = now.Add(200 * time.Millisecond)
	tm.Mark(PhaseDump)
	tm.Add(PhaseNetwork, 7.5)
	now = now.Add(100 * time.Millisecond)
	tm.Mark(PhaseTransfer)
	if got := tm.Downtime(); got != 300*time.Millisecond {
		t.Errorf("downtime = %v, want 300ms (freeze to now)", got)
	}
	if got := tm.Elapsed(); got != 340*time.Millisecond {
		t.Errorf("elapsed = %v, want 340ms", got)
	}
	want := map[string]float64{PhasePrepare: 40, PhaseDump: 200, PhaseNetwork: 7.5, PhaseTransfer: 100}
	got := tm.Phases()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("phase %s = %v, want %v", k, got[k], v)
		}
	}
	got[PhaseDump] = 0
	if tm.Phases()[PhaseDump] != 200 {
		t.Error("Phases must return a copy")
	}
}

func TestParseStrategy(t *testing.T) {
	for in, want := range map[string]Strategy{"": StopAndCopy, "stop-and-copy": StopAndCopy, "post-copy": PostCopy, "auto": Auto} {
		if got, err := ParseStrategy(in); err != nil || got != want {
			t.Errorf("ParseStrategy(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseStrategy("teleport"); err == nil {
		t.Error("unknown strategy accepted")
	}
}

func TestRestoreDeadline(t *testing.T) {
	if got := RestoreDeadline(0); got != 30*time.Second {
		t.Errorf("RestoreDeadline(0) = %v, want 30s", got)
	}
	if got := RestoreDeadline(1 << 30); got != 62*time.Second {
		t.Errorf("RestoreDeadline(1 GiB) = %v, want 62s", got)
	}
	if RestoreDeadline(-1) != RestoreDeadline(0) {
		t.Error("negative sizes must count as zero")
	}
}

func TestUnitResult(t *testing.T) {
	one := Result{Container: "redis", OK: true, Outcome: OutcomeOK, DowntimeMs: 50}
	if got := UnitResult([]Result{one}); got.DowntimeMs != 50 || !got.OK || got.Container != "redis" {
		t.Errorf("one member: %+v", got)
	}
	db := Result{Container: "db", OK: true, Outcome: OutcomeOK, DowntimeMs: 80, TotalMs: 900, BytesOnWire: 10, StateBytes: 7,
		ForwardedConnections: 1, PhasesMs: map[string]float64{"dump": 40}}
	web := Result{Container: "web", OK: true, Outcome: OutcomeOK, DowntimeMs: 60, TotalMs: 1200, BytesOnWire: 5, StateBytes: 3,
		ForwardedConnections: 2, PhasesMs: map[string]float64{"dump": 30}}
	got := UnitResult([]Result{db, web})
	if !got.OK || got.Outcome != OutcomeOK || got.Error != "" || got.DowntimeMs != 80 || got.PhasesMs["dump"] != 40 ||
		got.TotalMs != 1200 || got.BytesOnWire != 15 || got.StateBytes != 10 || got.ForwardedConnections != 3 {
		t.Errorf("two members moved: %+v", got)
	}
	web.OK, web.Outcome, web.Error = false, OutcomeRolledBack, "dump failed"
	failed := UnitResult([]Result{db, web, {Container: "cache", Outcome: OutcomeLost, Error: "restore failed"}})
	if failed.OK || failed.Outcome != OutcomeRolledBack || !failed.RolledBack ||
		failed.Error != "web: dump failed; cache: restore failed" || failed.DowntimeMs != 80 {
		t.Errorf("members failed: %+v", failed)
	}
	if got := UnitResult(nil); got.OK || got.Error == "" {
		t.Errorf("no member: %+v", got)
	}
}

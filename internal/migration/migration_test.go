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

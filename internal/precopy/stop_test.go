package precopy

import (
	"testing"
	"time"
)

func TestShouldStop(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	round := func(changed int64, d time.Duration) RoundStats {
		return RoundStats{Changed: changed, Duration: d}
	}
	full := round(50000, 2*time.Second) // a first round: everything
	tests := []struct {
		name    string
		history []RoundStats
		rule    StopRule
		want    StopReason
	}{
		{"no round yet", nil, StopRule{MaxRounds: 1}, ""},
		{"max rounds reached", []RoundStats{full, round(9000, time.Second)}, StopRule{MaxRounds: 2}, StopRounds},
		{"max rounds not reached", []RoundStats{full}, StopRule{MaxRounds: 2}, ""},
		// 100 pages = 409600 bytes.
		{"delta small enough", []RoundStats{full, round(100, time.Second)}, StopRule{DeltaBytes: 409600}, StopDelta},
		{"delta one page too big", []RoundStats{full, round(101, time.Second)}, StopRule{DeltaBytes: 409600}, ""},
		{"shrinking", []RoundStats{full, round(9000, time.Second), round(7000, time.Second)}, StopRule{MinShrink: 0.9}, ""},
		{"not shrinking enough", []RoundStats{full, round(9000, time.Second), round(8500, time.Second)}, StopRule{MinShrink: 0.9}, StopNoProgress},
		{"everything rewritten during the first round", []RoundStats{full, round(49000, time.Second)}, StopRule{MinShrink: 0.9}, StopNoProgress},
		{"next round would pass the deadline", []RoundStats{full, round(9000, 3*time.Second)}, StopRule{Deadline: now.Add(2 * time.Second)}, StopDeadline},
		{"next round fits the deadline", []RoundStats{full, round(9000, time.Second)}, StopRule{Deadline: now.Add(2 * time.Second)}, ""},
		{"rounds before delta", []RoundStats{full, round(10, time.Second)}, StopRule{MaxRounds: 2, DeltaBytes: 1 << 20}, StopRounds},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.rule.Validate(); err != nil {
				t.Fatalf("rule invalid: %v", err)
			}
			got, stop := ShouldStop(tt.history, tt.rule, now)
			if got != tt.want || stop != (tt.want != "") {
				t.Fatalf("ShouldStop = %q, %v; want %q", got, stop, tt.want)
			}
		})
	}
}

func TestStopRuleValidate(t *testing.T) {
	for _, r := range []StopRule{{}, {MaxRounds: -1}, {DeltaBytes: -1, MaxRounds: 1}, {MinShrink: -0.5}} {
		if r.Validate() == nil {
			t.Errorf("%+v: valid, want an error", r)
		}
	}
}

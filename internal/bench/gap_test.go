package bench

import (
	"testing"
	"time"
)

// at returns t0 plus the given milliseconds.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(msec ...float64) []time.Time {
	out := make([]time.Time, len(msec))
	for i, m := range msec {
		out[i] = t0.Add(time.Duration(m * float64(time.Millisecond)))
	}
	return out
}

func TestLongestGap(t *testing.T) {
	every5 := func(from, to float64) []float64 {
		var xs []float64
		for m := from; m <= to; m += 5 {
			xs = append(xs, m)
		}
		return xs
	}
	// Replies every 5 ms, silent from 100 to 340 ms, then every 5 ms.
	withGap := append(every5(0, 100), every5(340, 600)...)
	tests := []struct {
		name      string
		replies   []float64
		from, to  float64
		end       float64
		wantLen   float64
		wantStart float64
		wantOpen  bool
	}{
		{"gap inside the window", withGap, 90, 300, 600, 240, 100, false},
		{"gap starting inside, ending after the window", withGap, 50, 120, 600, 240, 100, false},
		{"gap starting before the window", withGap, 200, 250, 600, 240, 100, false},
		{"window before the gap", withGap, 0, 95, 600, 5, 0, false},
		{"window after the gap", withGap, 345, 500, 600, 5, 345, false},
		{"window touching the gap's end", withGap, 340, 500, 600, 5, 340, false},
		{"no reply after the gap", every5(0, 100), 90, 200, 1000, 900, 100, true},
		{"no reply at all", nil, 90, 200, 1000, 910, 90, true},
		{"no reply before the window", every5(300, 400), 100, 350, 400, 200, 100, false},
		{"two gaps, the longer wins", []float64{0, 50, 60, 200, 210}, 0, 205, 210, 140, 60, false},
		{"steady", every5(0, 600), 100, 300, 600, 5, 100, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := LongestGap(at(tt.replies...), at(tt.from)[0], at(tt.to)[0], at(tt.end)[0])
			if ms(g.Length) != tt.wantLen || ms(g.Start.Sub(t0)) != tt.wantStart || g.Open != tt.wantOpen {
				t.Fatalf("LongestGap = %v from %v open %v, want %v ms from %v ms open %v",
					g.Length, g.Start.Sub(t0), g.Open, tt.wantLen, tt.wantStart, tt.wantOpen)
			}
		})
	}
}

// TestSummarizeRuns checks the whole aggregation: per-run gaps from one
// timeline, distributions over the successful runs only, lost bytes.
func TestSummarizeRuns(t *testing.T) {
	var replies []float64
	for m := 0.0; m <= 3000; m += 5 {
		switch {
		case m > 500 && m < 800: // run 0: 300 ms silence (from 500 to 800)
		case m > 1500 && m < 1600: // run 1: 100 ms
		case m > 2500 && m < 2520: // run 2 (failed): 20 ms
		default:
			replies = append(replies, m)
		}
	}
	tm := func(m float64) time.Time { return at(m)[0] }
	runs := []Migration{
		{Index: 0, OK: true, DowntimeMs: 250, TotalMs: 400, PhasesMs: map[string]float64{"dump": 100, "network": 10}, BytesOnWire: 1000, start: tm(450), end: tm(750)},
		{Index: 1, OK: true, DowntimeMs: 90, TotalMs: 200, PhasesMs: map[string]float64{"dump": 50, "network": 4}, BytesOnWire: 3000, start: tm(1450), end: tm(1650)},
		{Index: 2, OK: false, Error: "rolled back", DowntimeMs: 999, start: tm(2450), end: tm(2600)},
	}
	o := observation{conns: 1, requests: 601, replies: uint64(len(replies)), unanswered: 2, mismatches: 1, replyTimes: at(replies...), end: tm(3000)}
	s := summarize(Side{Path: "x"}, runs, o, 250*time.Millisecond)

	if !s.Available || s.Runs != 2 || s.Failed != 1 {
		t.Fatalf("runs %d failed %d available %v, want 2, 1, true", s.Runs, s.Failed, s.Available)
	}
	wantGaps := []float64{300, 100, 20}
	for i, w := range wantGaps {
		if s.PerRun[i].GapMs != w {
			t.Errorf("run %d gap %v, want %v", i, s.PerRun[i].GapMs, w)
		}
	}
	if s.PerRun[0].GapStartMs != 50 {
		t.Errorf("run 0 gap starts %v ms after the request, want 50", s.PerRun[0].GapStartMs)
	}
	if s.GapMs.P50 != 200 || s.GapMs.Max != 300 {
		t.Errorf("gap summary %+v, want p50 200 (of 100 and 300), max 300", s.GapMs)
	}
	if s.DowntimeMs.Max != 250 || s.PhasesMs["network"].P50 != 7 || s.BytesOnWire.P50 != 2000 {
		t.Errorf("downtime %+v network %+v bytes %+v: the failed run must not count", s.DowntimeMs, s.PhasesMs["network"], s.BytesOnWire)
	}
	if s.LostBytes != 3*probeLineSize || s.Mismatches != 1 {
		t.Errorf("lost bytes %d, want %d (2 unanswered + 1 mismatched line)", s.LostBytes, 3*probeLineSize)
	}
}

func TestGoals(t *testing.T) {
	ratio := 25.0
	r := &Report{Side: Side{Runs: 3, GapMs: Summary{P50: 40}, PhasesMs: map[string]Summary{"network": {P50: 30}}}, Ratio: &ratio}
	got := goals(r)
	want := []bool{true, false, true}
	if len(got) != len(want) {
		t.Fatalf("%d goals, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Met != want[i] || got[i].Measured == nil {
			t.Errorf("goal %q: met %v measured %v, want met %v", got[i].Name, got[i].Met, got[i].Measured, want[i])
		}
	}
	r.Ratio = nil
	if g := goals(r)[2]; g.Met || g.Measured != nil {
		t.Errorf("goal without a baseline: %+v, want unmeasured and unmet", g)
	}
}

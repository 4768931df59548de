package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestARNABGrid(t *testing.T) {
	full, quick := ARNABConfig{}.grid(), ARNABConfig{Quick: true}.grid()
	if len(full) != 4 || full[0].stateMB != 14 || full[3].stateMB != 1200 || full[3].dirtyPct != 20 {
		t.Errorf("full grid %+v, want 14 MB and 1.2 GB at 5, 10, 20 %%", full)
	}
	if len(quick) != 2 || quick[1].stateMB != 300 {
		t.Errorf("quick grid %+v", quick)
	}
	if got := strings.Join(dprgenArgs(arnabCase{1200, 5}), " "); got != "--state-mb 1200 --dirty-fraction 0.05" {
		t.Errorf("dprgen args %q", got)
	}
}

// TestARNABRatiosAndGoal: ratios compare a case with the baselines of the
// same service only, failed baselines give none, and the goal takes the
// best edgehop strategy on the 1.2 GB, 20 % case, never the rsync method.
func TestARNABRatiosAndGoal(t *testing.T) {
	cases := []ARNABCase{
		{Strategy: "stop-and-copy", StateMB: 1200, DirtyPct: 20, OK: true, DowntimeMs: 13000, TotalMs: 16000},
		{Strategy: "hybrid", StateMB: 1200, DirtyPct: 20, OK: true, DowntimeMs: 800, TotalMs: 28000},
		{Strategy: RsyncMethod, StateMB: 1200, DirtyPct: 20, OK: true, DowntimeMs: 400, TotalMs: 40000},
		{Strategy: "hybrid", StateMB: 1200, DirtyPct: 10, OK: true, DowntimeMs: 700, TotalMs: 20000},
		{Strategy: "stop-and-copy", StateMB: 1200, DirtyPct: 10, OK: false},
	}
	arnabRatios(cases)
	h := cases[1]
	if h.DowntimeVsStopAndCopy == nil || *h.DowntimeVsStopAndCopy != 13000.0/800 || h.TotalVsRsync == nil || *h.TotalVsRsync != 40000.0/28000 {
		t.Errorf("hybrid ratios %+v", h)
	}
	if cases[3].DowntimeVsStopAndCopy != nil || cases[3].DowntimeVsRsync != nil {
		t.Errorf("10%% case got ratios against baselines that failed or did not run: %+v", cases[3])
	}
	g := arnabGoals(cases)
	if len(g) != 3 || g[0].Measured == nil || *g[0].Measured != 800 || !g[0].Met {
		t.Errorf("goal %+v, want 800 ms met (the rsync method's 400 ms does not count)", g)
	}
	if g[1].Measured != nil || g[1].Met || g[2].Measured != nil || g[2].Met {
		t.Errorf("post-copy goals without a post-copy case: %+v %+v", g[1], g[2])
	}
	for _, g := range arnabGoals(cases[3:]) {
		if g.Measured != nil || g.Met {
			t.Errorf("goal without the 1.2 GB 20%% case: %+v", g)
		}
	}
	// Post-copy at line rate: both limits hold, or the goal is missed.
	pc := func(downtime, total float64) []Goal {
		return arnabGoals([]ARNABCase{{Strategy: "post-copy", StateMB: 1200, DirtyPct: 20, OK: true, DowntimeMs: downtime, TotalMs: total}})
	}
	if g := pc(190, 10900); !g[1].Met || !g[2].Met || *g[1].Measured != 10900 || *g[2].Measured != 190 {
		t.Errorf("post-copy 190 ms / 10.9 s: %+v", g)
	}
	if g := pc(210, 11100); g[1].Met || g[2].Met {
		t.Errorf("post-copy 210 ms / 11.1 s met its goals: %+v", g)
	}
	var b bytes.Buffer
	if err := (&ARNABReport{Cases: cases, Goals: g}).WriteText(&b); err != nil || !strings.Contains(b.String(), "FAILED") {
		t.Errorf("text: %v\n%s", err, b.String())
	}
}

func TestTekaGrid(t *testing.T) {
	l := nodeLinkFor(100, 60)
	if l.RateBps != 60_000_000 || l.Delay != 25*time.Millisecond {
		t.Errorf("link for 100 ms, 60 Mbit/s: %+v", l)
	}
	if len(teka6) != len(tekaBWMbps) || len(teka7) != len(tekaBWMbps) || len(teka6[0]) != len(tekaRTTMs) {
		t.Fatal("paper tables do not match the grid")
	}
	// Table 6 grows with RTT at every bandwidth, as the paper says.
	for bi := range teka6 {
		for ri := 1; ri < len(tekaRTTMs); ri++ {
			if teka6[bi][ri] < teka6[bi][ri-1] || teka7[bi][ri] < teka7[bi][ri-1] {
				t.Errorf("paper tables not monotone in RTT at %v Mbit/s", tekaBWMbps[bi])
			}
		}
	}
}

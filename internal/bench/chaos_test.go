package bench

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/edgehop/edgehop/internal/migration"
)

func chaosStrategies(n int) []migration.Strategy {
	all := []migration.Strategy{migration.StopAndCopy, migration.PreCopy, migration.PostCopy, migration.Hybrid}
	out := make([]migration.Strategy, n)
	for i := range out {
		out[i] = all[(i/3)%len(all)]
	}
	return out
}

// TestChaosPlanFromSeed: a seed gives one plan; with probability 1 every
// migration gets a fault, the kinds taking turns so that each of the three
// services meets each kind; phases are ones the victim goes through.
func TestChaosPlanFromSeed(t *testing.T) {
	sts := chaosStrategies(120)
	a, b := planFaults(7, sts, 1), planFaults(7, sts, 1)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two plans")
	}
	if reflect.DeepEqual(a, planFaults(8, sts, 1)) {
		t.Fatal("seeds 7 and 8 gave the same plan")
	}
	kindsBySvc := map[int]map[FaultKind]int{}
	byPhase := 0
	for i, f := range a {
		if f.Kind == FaultNone {
			t.Fatalf("migration %d has no fault at probability 1", i)
		}
		if want := []FaultKind{KillSource, KillDestination, CutLink}[(i+i/3)%3]; f.Kind != want {
			t.Errorf("migration %d: %s, want %s (turns)", i, f.Kind, want)
		}
		if kindsBySvc[i%3] == nil {
			kindsBySvc[i%3] = map[FaultKind]int{}
		}
		kindsBySvc[i%3][f.Kind]++
		switch f.Kind {
		case CutLink:
			if f.CutFor < minCut || f.CutFor > maxCut || (f.CutNode != "source" && f.CutNode != "destination") {
				t.Errorf("migration %d: cut %+v", i, f)
			}
			if f.Phase != "" && !slices.Contains(cutPhases(sts[i]), f.Phase) {
				t.Errorf("migration %d (%s): cut aimed at %s", i, sts[i], f.Phase)
			}
			if f.Phase == migration.Committed && !lazy(sts[i]) {
				t.Errorf("migration %d: cut aimed at the lazy window of %s", i, sts[i])
			}
		default:
			if f.Phase != "" {
				byPhase++
				ok := false
				for _, p := range killPhases(f.Kind, sts[i]) {
					ok = ok || p == f.Phase
				}
				if !ok {
					t.Errorf("migration %d (%s): %s in phase %s, which it never journals", i, sts[i], f.Kind, f.Phase)
				}
				if f.Phase == migration.LiveRounds && (sts[i] == migration.StopAndCopy || sts[i] == migration.PostCopy) {
					t.Errorf("migration %d: live rounds under %s", i, sts[i])
				}
			}
		}
		if f.At < 0 || f.At >= 1 {
			t.Errorf("migration %d: at %v outside [0,1)", i, f.At)
		}
	}
	for svc, kinds := range kindsBySvc {
		if len(kinds) != 3 {
			t.Errorf("service %d meets only %v", svc, kinds)
		}
	}
	if byPhase == 0 || byPhase == 80 {
		t.Errorf("%d of 80 kills aimed at a phase: want some by phase and some by delay", byPhase)
	}
}

// TestChaosPlanProbability: probability 0 plans nothing; a fraction plans
// about that share, and the plan of one migration does not depend on
// whether the others got a fault.
func TestChaosPlanProbability(t *testing.T) {
	sts := chaosStrategies(1000)
	for _, f := range planFaults(3, sts, 0) {
		if f.Kind != FaultNone {
			t.Fatalf("fault %+v at probability 0", f)
		}
	}
	n := 0
	for _, f := range planFaults(3, sts, 0.3) {
		if f.Kind != FaultNone {
			n++
		}
	}
	if n < 250 || n > 350 {
		t.Errorf("%d of 1000 migrations got a fault at probability 0.3", n)
	}
	if err := (ChaosConfig{Probability: 1.5}).Validate(); err == nil {
		t.Error("probability 1.5 accepted")
	}
}

func TestChaosPhaseRank(t *testing.T) {
	order := []migration.Phase{migration.Preparing, migration.Prepared, migration.LiveRounds, migration.Frozen,
		migration.Transferred, migration.Restored, migration.Committed, migration.Done}
	for i := 1; i < len(order); i++ {
		if phaseRank(order[i-1]) >= phaseRank(order[i]) {
			t.Errorf("%s does not come before %s", order[i-1], order[i])
		}
	}
	for _, p := range []migration.Phase{migration.Aborted, migration.RolledBack, migration.Lost} {
		if phaseRank(p) < phaseRank(migration.Committed) {
			t.Errorf("final %s ranks before committed", p)
		}
	}
	if phaseRank("") >= phaseRank(migration.Preparing) {
		t.Error("no record ranks at or after preparing")
	}
}

// TestChaosLazyWindow: only post-copy and hybrid, only past the commit and
// before the source is done.
func TestChaosLazyWindow(t *testing.T) {
	for _, tc := range []struct {
		st       migration.Strategy
		src, dst migration.Phase
		want     bool
	}{
		{migration.PostCopy, migration.Committed, migration.Restored, true},
		{migration.Hybrid, migration.Committed, migration.Committed, true},
		{migration.PostCopy, migration.Frozen, migration.Committed, true},
		{migration.PostCopy, migration.Frozen, migration.Restored, false}, // before the commit: rolls back
		{migration.PostCopy, migration.Done, migration.Committed, false},  // every page arrived
		{migration.StopAndCopy, migration.Committed, migration.Committed, false},
		{migration.PreCopy, migration.Committed, migration.Restored, false},
	} {
		if got := inLazyWindow(tc.st, tc.src, tc.dst); got != tc.want {
			t.Errorf("%s source %s destination %s: %v, want %v", tc.st, tc.src, tc.dst, got, tc.want)
		}
	}
}

// TestChaosReportAccounting: kills by victim and phase, cuts in and out of
// the lazy window, outcomes, and a service running nowhere counted as lost
// unless a cut in the lazy window lost it; an agent killed in that window
// is no excuse.
func TestChaosReportAccounting(t *testing.T) {
	r := newChaosReport(ChaosConfig{Seed: 5, Probability: 1})
	ms := []ChaosMigration{
		{Fault: Fault{Kind: KillSource}, KilledIn: "frozen", Outcome: "rolled-back", From: "node0", To: "node1", Running: []string{"node0"}, SettleMs: 900},
		{Fault: Fault{Kind: KillDestination}, KilledIn: "restored", Outcome: "ok", From: "node1", To: "node2", Running: []string{"node2"}, SettleMs: 4000},
		{Fault: Fault{Kind: CutLink}, CutInLazyWindow: true, Strategy: migration.PostCopy, Outcome: "lost", From: "node2", To: "node0", SettleMs: 20000},
		{Fault: Fault{Kind: KillSource}, KilledIn: "committed", Strategy: migration.PostCopy, Outcome: "ok", From: "node0", To: "node1", SettleMs: 3000},
		{Fault: Fault{Kind: CutLink}, Outcome: "aborted", From: "node0", To: "node1", Running: []string{"node0", "node1"}, SettleMs: 100},
		{Fault: Fault{Kind: KillDestination}, KilledIn: "none", Outcome: "aborted", From: "node1", To: "node2", Running: []string{"node2"}, SettleMs: 50},
		{Fault: Fault{Kind: KillSource}, KilledIn: "frozen", Outcome: "failed", From: "node1", To: "node2", Running: []string{"node1"}, SettleMs: 180000},
	}
	for _, m := range ms {
		r.add(m)
	}
	want := struct {
		kills, src, dst, cuts, lazy, lost, design, dup, misplaced, failures int
		longest                                                             float64
	}{5, 3, 2, 2, 1, 1, 1, 1, 1, 4, 180000}
	got := struct {
		kills, src, dst, cuts, lazy, lost, design, dup, misplaced, failures int
		longest                                                             float64
	}{r.Kills, r.KillsBy["source"], r.KillsBy["destination"], r.LinkCuts, r.LinkCutsLazy, r.ServicesLost, r.LostByDesign,
		r.Duplicated, r.Misplaced, r.Failures(), r.LongestSettle}
	if got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	if r.LinkCutsPhase["/"] != 2 {
		t.Errorf("cuts by phase %v", r.LinkCutsPhase)
	}
	if r.KillsPhase["source/frozen"] != 2 || r.KillsPhase["destination/restored"] != 1 || r.KillsPhase["destination/none"] != 1 {
		t.Errorf("kills by phase %v", r.KillsPhase)
	}
	if r.Outcomes["ok"] != 2 || r.Outcomes["aborted"] != 2 || r.Outcomes["rolled-back"] != 1 || r.Outcomes["lost"] != 1 || r.Outcomes["failed"] != 1 {
		t.Errorf("outcomes %v", r.Outcomes)
	}
	if len(r.PerMigration) != len(ms) || r.Settle.Max != 180000 {
		t.Errorf("per migration %d, settle %+v", len(r.PerMigration), r.Settle)
	}
	for i, m := range ms {
		if wantBad := i >= 2; m.bad() != wantBad {
			t.Errorf("migration %d: bad %v, want %v", i, m.bad(), wantBad)
		}
	}
}

// TestChaosClientStalledOnce: a service that stops serving counts once
// until its client makes progress again; a lost one's silence is its loss.
func TestChaosClientStalledOnce(t *testing.T) {
	s := &soak{chaos: newChaos(ChaosConfig{Probability: 1}, chaosStrategies(3))}
	r := s.chaos.rep
	stall := errors.New("no write acknowledged")
	run := func(running []string, err error) {
		r.add(ChaosMigration{Fault: Fault{Kind: KillSource}, Outcome: "rolled-back", From: "node0", To: "node1", Running: running})
		s.clientChecked("mc", err)
	}
	run([]string{"node0"}, stall)
	run([]string{"node0"}, stall)
	run([]string{"node0"}, nil)
	run([]string{"node0"}, stall)
	run(nil, stall)
	if r.ClientStalled != 2 || !r.PerMigration[0].ClientStalled || r.PerMigration[1].ClientStalled || !r.PerMigration[3].ClientStalled {
		t.Errorf("stalled %d: %+v", r.ClientStalled, r.PerMigration)
	}
	if r.Failures() != 2+1 {
		t.Errorf("failures %d, want 2 stalls and 1 loss", r.Failures())
	}
}

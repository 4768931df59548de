package migration

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files in testdata")

var errX = errors.New("boom")

func ev(k EventKind) Event { return Event{Kind: k} }
func fail() Event          { return Event{Kind: EvFailed, Err: errX} }

// run feeds events to m and returns every action, as strings, in order.
func run(t *testing.T, m stepper, events ...Event) []string {
	t.Helper()
	var out []string
	for _, e := range events {
		acts, err := m.Step(e)
		if err != nil {
			t.Fatalf("Step(%s): %v (so far: %s)", e.Kind, err, strings.Join(out, ", "))
		}
		for _, a := range acts {
			out = append(out, a.String())
		}
	}
	return out
}

func join(s ...string) string { return strings.Join(s, ", ") }

// Scenario tables: each row is a sequence of events and every action the
// machine must take in answer, phase by phase and failure by failure.
func TestSourceScenarios(t *testing.T) {
	start := []string{"journal preparing", "prepare"}
	freeze := []string{"journal frozen", "freeze"}
	toCommit := append(append(append([]string{}, start...), freeze...), "dump", "send state", "journal committed", "commit", "await destination")
	happy := []Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvDumped), ev(EvSent)}
	for _, tc := range []struct {
		name     string
		strategy Strategy
		events   []Event
		want     []string
	}{
		{"stop-and-copy happy path: the commit follows the state", StopAndCopy,
			append(happy, ev(EvSwitched), ev(EvReleased)),
			append(append([]string{}, toCommit...), "release source", "journal done", "finish ok")},
		{"pre-copy runs live rounds before the freeze", PreCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvRoundsDone)},
			append(append(append([]string{}, start...), "journal live-rounds", "live rounds"), freeze...)},
		{"post-copy waits for the lazy pages once served", PostCopy,
			append(happy, ev(EvSwitched), ev(EvLazyDone), ev(EvReleased)),
			append(append([]string{}, toCommit...), "await lazy pages", "release source", "journal done", "finish ok")},
		{"prepare fails: aborted, the service never stopped", StopAndCopy,
			[]Event{ev(EvStart), fail()},
			append(append([]string{}, start...), "abort peer", "journal aborted", "finish aborted (boom)")},
		{"the destination refuses: no abort sent back", StopAndCopy,
			[]Event{ev(EvStart), {Kind: EvPeerAborted, Err: errX}},
			append(append([]string{}, start...), "journal aborted", "finish aborted (boom)")},
		{"cancelled during the live rounds", Hybrid,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvCancel)},
			append(append([]string{}, start...), "journal live-rounds", "live rounds", "abort peer", "journal aborted", "finish aborted (cancelled)")},
		{"cancelled as the freeze begins", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvCancel)},
			append(append(append([]string{}, start...), freeze...), "abort peer", "journal aborted", "finish aborted (cancelled)")},
		{"a live round fails: aborted", PreCopy,
			[]Event{ev(EvStart), ev(EvPrepared), fail()},
			append(append([]string{}, start...), "journal live-rounds", "live rounds", "abort peer", "journal aborted", "finish aborted (boom)")},
		{"the freeze fails: resumed, not restored", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), fail(), ev(EvResumed)},
			append(append(append([]string{}, start...), freeze...), "abort peer", "resume", "journal rolled-back", "finish rolled-back (boom)")},
		{"the freeze cannot be journaled: nothing froze", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), {Kind: EvJournalFailed, Err: errX}, ev(EvResumed)},
			append(append(append([]string{}, start...), freeze...), "abort peer", "resume", "journal rolled-back", "finish rolled-back (boom)")},
		{"the dump fails: resumed", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), fail(), ev(EvResumed)},
			append(append(append([]string{}, start...), freeze...), "dump", "abort peer", "resume", "journal rolled-back", "finish rolled-back (boom)")},
		{"sending fails after the dump: restored from images", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvDumped), fail(), ev(EvResumed)},
			append(append(append([]string{}, start...), freeze...), "dump", "send state", "abort peer", "restore on source", "journal rolled-back", "finish rolled-back (boom)")},
		{"the frozen budget runs out while sending", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvDumped), ev(EvBudget), ev(EvResumed)},
			append(append(append([]string{}, start...), freeze...), "dump", "send state", "abort peer", "restore on source", "journal rolled-back", "finish rolled-back (frozen-window budget exhausted)")},
		{"the commit cannot be journaled: rolled back, never committed", StopAndCopy,
			append(happy, Event{Kind: EvJournalFailed, Err: errX}, ev(EvResumed)),
			append(append(append([]string{}, start...), freeze...), "dump", "send state", "journal committed", "commit", "await destination",
				"abort peer", "restore on source", "journal rolled-back", "finish rolled-back (boom)")},
		{"the destination's restore fails after the commit: handed back", StopAndCopy,
			append(happy, Event{Kind: EvPeerAborted, Err: errX}, ev(EvResumed)),
			append(append([]string{}, toCommit...), "restore on source", "journal rolled-back", "finish rolled-back (boom)")},
		{"the destination goes silent after the commit: its journal says it serves", StopAndCopy,
			append(happy, fail(), ev(EvPeerCommitted), ev(EvReleased)),
			append(append([]string{}, toCommit...), "ask destination", "release source", "journal done", "finish ok")},
		{"the destination goes silent after the commit: its journal says it holds nothing", StopAndCopy,
			append(happy, fail(), ev(EvPeerGaveUp), ev(EvResumed)),
			append(append([]string{}, toCommit...), "ask destination", "restore on source", "journal rolled-back", "finish rolled-back (the destination holds no copy)")},
		{"stopping while the destination is silent keeps the commit", StopAndCopy,
			append(happy, fail(), fail()),
			append(append([]string{}, toCommit...), "ask destination", "finish undecided (the peer's decision is unknown; asked again when the agent starts\nboom)")},
		{"the rollback fails: lost", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvDumped), fail(), fail()},
			append(append(append([]string{}, start...), freeze...), "dump", "send state", "abort peer", "restore on source", "journal lost", "finish lost (boom\nboom)")},
		{"post-copy pages lost after the switch, the destination's copy runs: ok with the error", PostCopy,
			append(happy, ev(EvSwitched), fail(), ev(EvPeerCommitted), ev(EvReleased)),
			append(append([]string{}, toCommit...), "await lazy pages", "check destination's copy", "release source", "journal done", "finish ok (boom)")},
		{"post-copy pages lost after the switch, no copy runs: lost, never ok", PostCopy,
			append(happy, ev(EvSwitched), fail(), ev(EvPeerGaveUp), ev(EvReleased)),
			append(append([]string{}, toCommit...), "await lazy pages", "check destination's copy", "release source", "journal lost", "finish lost (boom)")},
		{"post-copy pages lost after the switch, the destination's copy destroyed and the tasks here: taken back", PostCopy,
			append(happy, ev(EvSwitched), fail(), ev(EvPeerDestroyed), ev(EvResumed)),
			append(append([]string{}, toCommit...), "await lazy pages", "check destination's copy", "restore on source", "journal rolled-back", "finish rolled-back (taken back from the destination, whose lazy pages were cut off (boom): the service resumed with its memory as frozen, and whatever the destination's copy acknowledged after its restore is lost)")},
		{"post-copy pages lost, the destination's copy destroyed, the take-back fails: lost", PostCopy,
			append(happy, ev(EvSwitched), fail(), ev(EvPeerDestroyed), fail()),
			append(append([]string{}, toCommit...), "await lazy pages", "check destination's copy", "restore on source", "journal lost", "finish lost (taken back from the destination, whose lazy pages were cut off (boom): the service resumed with its memory as frozen, and whatever the destination's copy acknowledged after its restore is lost\nboom)")},
		{"post-copy pages lost after the switch, the destination unknown: lost", PostCopy,
			append(happy, ev(EvSwitched), fail(), fail(), ev(EvReleased)),
			append(append([]string{}, toCommit...), "await lazy pages", "check destination's copy", "release source", "journal lost", "finish lost (boom\nboom)")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, NewSource(tc.strategy), tc.events...)
			if join(got...) != join(tc.want...) {
				t.Errorf("actions\n got: %s\nwant: %s", join(got...), join(tc.want...))
			}
		})
	}
}

func TestDestScenarios(t *testing.T) {
	start := []string{"journal preparing", "set up"}
	upToRestore := append(append([]string{}, start...), "journal prepared", "ack prepared, await freeze",
		"journal frozen", "take traffic (held)", "receive state", "journal transferred", "restore",
		"journal restored", "await commit")
	toRestored := []Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvSent), ev(EvRestored)}
	for _, tc := range []struct {
		name     string
		strategy Strategy
		events   []Event
		want     []string
	}{
		{"happy path: packets held until the commit is journaled", StopAndCopy,
			append(toRestored, ev(EvCommit)),
			append(append([]string{}, upToRestore...), "journal committed", "release held packets", "report serving", "journal done", "finish ok")},
		{"post-copy waits for its pages", PostCopy,
			append(toRestored, ev(EvCommit), ev(EvLazyDone)),
			append(append([]string{}, upToRestore...), "journal committed", "release held packets", "report serving", "await lazy pages", "journal done", "finish ok")},
		{"setup fails: the source is told once it is cleaned up", StopAndCopy,
			[]Event{ev(EvStart), fail(), ev(EvDestroyed)},
			append(append([]string{}, start...), "destroy copy", "journal aborted", "abort peer", "finish aborted (boom)")},
		{"the source gives up before the freeze", PreCopy,
			[]Event{ev(EvStart), ev(EvPrepared), {Kind: EvPeerAborted, Err: errX}, ev(EvDestroyed)},
			append(append([]string{}, start...), "journal prepared", "ack prepared, await freeze", "destroy copy", "journal aborted", "finish aborted (boom)")},
		{"receiving fails", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), fail(), ev(EvDestroyed)},
			append(append([]string{}, start...), "journal prepared", "ack prepared, await freeze", "journal frozen", "take traffic (held)",
				"receive state", "destroy copy", "journal aborted", "abort peer", "finish aborted (boom)")},
		{"the restore fails: the copy goes, then the service is handed back", StopAndCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvSent), fail(), ev(EvDestroyed)},
			append(append([]string{}, start...), "journal prepared", "ack prepared, await freeze", "journal frozen", "take traffic (held)",
				"receive state", "journal transferred", "restore", "destroy copy", "journal aborted", "abort peer", "finish aborted (boom)")},
		{"the source rolls back during the restore: the copy goes, the source is not told", PostCopy,
			[]Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvSent), {Kind: EvPeerAborted, Err: errX}, ev(EvDestroyed)},
			append(append([]string{}, start...), "journal prepared", "ack prepared, await freeze", "journal frozen", "take traffic (held)",
				"receive state", "journal transferred", "restore", "destroy copy", "journal aborted", "finish aborted (boom)")},
		{"the source rolls back before its commit: the copy goes", StopAndCopy,
			append(toRestored, Event{Kind: EvPeerAborted, Err: errX}, ev(EvDestroyed)),
			append(append([]string{}, upToRestore...), "destroy copy", "journal aborted", "finish aborted (boom)")},
		{"the source is lost before its commit arrived, and had committed", StopAndCopy,
			append(toRestored, fail(), ev(EvPeerCommitted)),
			append(append([]string{}, upToRestore...), "ask source", "journal committed", "release held packets", "journal done", "finish ok")},
		{"the source is lost and rolled back", StopAndCopy,
			append(toRestored, fail(), ev(EvPeerGaveUp), ev(EvDestroyed)),
			append(append([]string{}, upToRestore...), "ask source", "destroy copy", "journal aborted", "finish aborted (the source kept the service)")},
		{"stopping while the source is silent keeps the copy and the journal", StopAndCopy,
			append(toRestored, fail(), fail()),
			append(append([]string{}, upToRestore...), "ask source", "finish undecided (the peer's decision is unknown; asked again when the agent starts\nboom)")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, NewDest(tc.strategy), tc.events...)
			if join(got...) != join(tc.want...) {
				t.Errorf("actions\n got: %s\nwant: %s", join(got...), join(tc.want...))
			}
		})
	}
}

// The destination never delivers held packets before it journaled the
// commit, never destroys a restored copy without the source's word, and
// hands a service back only after its copy is destroyed and that is
// journaled.
func TestDestInvariants(t *testing.T) {
	for _, s := range []Strategy{StopAndCopy, PostCopy, PreCopy, Hybrid} {
		for _, tail := range [][]Event{{ev(EvCommit)}, {fail()}, {{Kind: EvPeerAborted, Err: errX}}, {fail(), ev(EvPeerGaveUp)}} {
			for _, restoreFails := range []bool{false, true} {
				d := NewDest(s)
				events := []Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen), ev(EvSent)}
				if restoreFails {
					events = append(events, fail())
				} else {
					events = append(append(events, ev(EvRestored)), tail...)
				}
				var acts []string
				for _, e := range events {
					if d.Pending() == ActDestroy && e.Kind != EvDestroyed {
						e = ev(EvDestroyed)
					}
					as, err := d.Step(e)
					if err != nil {
						t.Fatal(err)
					}
					for _, a := range as {
						acts = append(acts, a.String())
					}
				}
				if d.Pending() == ActDestroy {
					as, _ := d.Step(ev(EvDestroyed))
					for _, a := range as {
						acts = append(acts, a.String())
					}
				}
				committed, destroyed, aborted := -1, -1, -1
				for i, a := range acts {
					switch a {
					case "journal committed":
						committed = i
					case "destroy copy":
						destroyed = i
					case "journal aborted":
						aborted = i
					case "release held packets":
						if committed < 0 {
							t.Errorf("%s: packets released before the commit was journaled: %s", s, join(acts...))
						}
					case "abort peer":
						if destroyed < 0 || aborted < 0 {
							t.Errorf("%s: service handed back before the copy was gone and journaled: %s", s, join(acts...))
						}
					}
				}
				if !restoreFails && len(tail) == 1 && tail[0].Kind == EvFailed && destroyed >= 0 {
					t.Errorf("%s: restored copy destroyed without the source's word: %s", s, join(acts...))
				}
			}
		}
	}
}

// The source never rolls back on its own after the commit, and a cancel is
// refused (an unexpected event) past the freeze.
func TestSourceAfterCommit(t *testing.T) {
	s := NewSource(StopAndCopy)
	for _, e := range []Event{ev(EvStart), ev(EvPrepared), ev(EvFrozen)} {
		if _, err := s.Step(e); err != nil {
			t.Fatal(err)
		}
	}
	if !s.PastFreeze() {
		t.Fatal("PastFreeze false after the freeze")
	}
	if _, err := s.Step(ev(EvCancel)); !errors.Is(err, ErrUnexpected) {
		t.Errorf("cancel past the freeze: err = %v, want ErrUnexpected", err)
	}
	for _, e := range []Event{ev(EvDumped), ev(EvSent)} {
		if _, err := s.Step(e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Step(ev(EvBudget)); !errors.Is(err, ErrUnexpected) {
		t.Errorf("a budget past the commit: err = %v, want ErrUnexpected (no rollback on the source's own account)", err)
	}
}

func TestRecoverSource(t *testing.T) {
	for _, tc := range []struct {
		strategy     Strategy
		phase        Phase
		destRestored bool
		events       []Event
		want         []string
	}{
		{StopAndCopy, Preparing, false, nil,
			[]string{"abort peer", "journal aborted", "finish aborted (the source agent restarted before the freeze)"}},
		{PreCopy, LiveRounds, false, nil,
			[]string{"abort peer", "journal aborted", "finish aborted (the source agent restarted before the freeze)"}},
		{StopAndCopy, Frozen, false, []Event{ev(EvResumed)},
			[]string{"abort peer", "restore on source", "journal rolled-back", "finish rolled-back (the source agent restarted past the freeze)"}},
		{StopAndCopy, Frozen, true, []Event{ev(EvPeerCommitted), ev(EvReleased)},
			[]string{"journal committed", "ask destination", "release source", "journal done", "finish ok"}},
		{PostCopy, Frozen, true, []Event{ev(EvResumed)},
			[]string{"abort peer", "restore on source", "journal rolled-back", "finish rolled-back (the source agent restarted past the freeze)"}},
		{StopAndCopy, Committed, false, []Event{ev(EvPeerCommitted), ev(EvReleased)},
			[]string{"ask destination", "release source", "journal done", "finish ok"}},
		{PostCopy, Committed, false, []Event{ev(EvPeerCommitted), ev(EvReleased)},
			[]string{"ask destination", "release source", "journal done", "finish ok"}},
		{StopAndCopy, Committed, false, []Event{ev(EvPeerGaveUp), ev(EvResumed)},
			[]string{"ask destination", "restore on source", "journal rolled-back", "finish rolled-back (the destination holds no copy)"}},
		{StopAndCopy, Done, false, nil, nil},
	} {
		t.Run(string(tc.strategy)+"/"+string(tc.phase), func(t *testing.T) {
			m, acts := RecoverSource(tc.strategy, tc.phase, tc.destRestored)
			var got []string
			for _, a := range acts {
				got = append(got, a.String())
			}
			got = append(got, run(t, m, tc.events...)...)
			if join(got...) != join(tc.want...) {
				t.Errorf("actions\n got: %s\nwant: %s", join(got...), join(tc.want...))
			}
		})
	}
}

func TestRecoverDest(t *testing.T) {
	destroyed := []string{"destroy copy", "journal aborted", "finish aborted (the destination agent restarted before the service was restored)"}
	for _, tc := range []struct {
		phase    Phase
		events   []Event
		want     []string
		strategy Strategy
	}{
		{Prepared, []Event{ev(EvDestroyed)}, destroyed, StopAndCopy},
		{Transferred, []Event{ev(EvDestroyed)}, destroyed, StopAndCopy},
		{Restored, []Event{ev(EvPeerCommitted)},
			[]string{"ask source", "journal committed", "release held packets", "journal done", "finish ok"}, StopAndCopy},
		{Restored, []Event{ev(EvPeerGaveUp), ev(EvDestroyed)},
			[]string{"ask source", "destroy copy", "journal aborted", "finish aborted (the source kept the service)"}, StopAndCopy},
		{Committed, nil,
			[]string{"journal committed", "release held packets", "journal done", "finish ok"}, StopAndCopy},
		// A lazy tail cut by the restart: the source decides.
		{Committed, []Event{ev(EvPeerCommitted)},
			[]string{"ask source for pages", "journal committed", "release held packets", "journal done", "finish ok"}, PostCopy},
		{Committed, []Event{ev(EvPeerGaveUp), ev(EvDestroyed)},
			[]string{"ask source for pages", "destroy copy", "journal aborted", "finish aborted (the lazy pages were cut off by the restart and the source holds the service again)"}, Hybrid},
		{Committed, []Event{fail()},
			[]string{"ask source for pages", "finish undecided (the peer's decision is unknown; asked again when the agent starts\nboom)"}, PostCopy},
	} {
		t.Run(string(tc.phase)+"/"+string(tc.strategy), func(t *testing.T) {
			m, acts := RecoverDest(tc.strategy, tc.phase)
			var got []string
			for _, a := range acts {
				got = append(got, a.String())
			}
			got = append(got, run(t, m, tc.events...)...)
			if join(got...) != join(tc.want...) {
				t.Errorf("actions\n got: %s\nwant: %s", join(got...), join(tc.want...))
			}
		})
	}
}

// The plans are golden files: a change to the protocol shows as a diff.
func TestPlans(t *testing.T) {
	var b strings.Builder
	for _, s := range []Strategy{StopAndCopy, PostCopy, PreCopy, Hybrid} {
		p, err := PlanFor(s)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(p.String())
	}
	path := filepath.Join("testdata", "plans.golden")
	if *rewrite {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -rewrite to create it)", err)
	}
	if b.String() != string(want) {
		t.Errorf("plans changed (run go test -rewrite if intended):\n%s", b.String())
	}
	if _, err := PlanFor(Auto); err == nil {
		t.Error("a plan for auto")
	}
}

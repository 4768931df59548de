package migration

import (
	"fmt"
	"strings"
)

// Plan is the printable happy path of a strategy: the actions each side
// takes when every step succeeds. It is produced by running the machines
// themselves, so it cannot drift from what the agents do.
type Plan struct {
	Strategy    Strategy `json:"strategy"`
	Source      []string `json:"source"`
	Destination []string `json:"destination"`
}

// success is the event that answers an awaited action when it succeeds.
var success = map[ActionKind]EventKind{
	ActPrepare: EvPrepared, ActRounds: EvRoundsDone, ActFreeze: EvFrozen, ActDump: EvDumped,
	ActSend: EvSent, ActAwaitOutcome: EvSwitched, ActAskDest: EvPeerCommitted, ActAwaitLazy: EvLazyDone,
	ActCheckDest: EvPeerCommitted, ActRelease: EvReleased, ActResume: EvResumed, ActRestoreLocal: EvResumed,
	ActSetupDest: EvPrepared, ActAckPrepared: EvFrozen, ActReceive: EvSent, ActRestore: EvRestored,
	ActAwaitCommit: EvCommit, ActAskSource: EvPeerCommitted, ActAskSourcePages: EvPeerCommitted, ActDestroy: EvDestroyed,
}

// stepper is what Source and Dest have in common.
type stepper interface {
	Step(Event) ([]Action, error)
	Pending() ActionKind
}

// PlanFor returns the plan of strategy s.
func PlanFor(s Strategy) (Plan, error) {
	if s == Auto {
		return Plan{}, fmt.Errorf("strategy %q is resolved by the planner first", s)
	}
	if _, err := ParseStrategy(string(s)); err != nil {
		return Plan{}, err
	}
	src, err := walk(NewSource(s))
	if err != nil {
		return Plan{}, err
	}
	dst, err := walk(NewDest(s))
	if err != nil {
		return Plan{}, err
	}
	return Plan{Strategy: s, Source: src, Destination: dst}, nil
}

// walk runs m from EvStart answering every awaited action with success.
func walk(m stepper) ([]string, error) {
	var out []string
	ev := Event{Kind: EvStart}
	for i := 0; i < 64; i++ {
		acts, err := m.Step(ev)
		if err != nil {
			return out, err
		}
		for _, a := range acts {
			out = append(out, a.String())
			if a.Kind == ActFinish {
				return out, nil
			}
		}
		ev = Event{Kind: success[m.Pending()]}
	}
	return out, fmt.Errorf("plan does not finish")
}

// String prints the plan, one side per line.
func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n  source:      %s\n  destination: %s\n", p.Strategy,
		strings.Join(p.Source, " → "), strings.Join(p.Destination, " → "))
	return b.String()
}

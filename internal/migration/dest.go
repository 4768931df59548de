package migration

import (
	"errors"
)

// Dest is the destination side of one migration as a pure state machine
// (see Source). The destination holds every packet for the service from
// the freeze until the commit: its restored copy answers nobody before the
// source committed, and it keeps that copy unless the source says it
// rolled back. Not safe for concurrent use.
type Dest struct {
	strategy Strategy
	phase    Phase
	pending  ActionKind
	cause    error // why the copy is destroyed
	lazyErr  error
}

// NewDest returns the machine of an incoming migration with strategy s.
func NewDest(s Strategy) *Dest { return &Dest{strategy: s} }

// Phase is where the destination stands.
func (d *Dest) Phase() Phase { return d.phase }

// Pending is the action whose outcome Step expects next.
func (d *Dest) Pending() ActionKind { return d.pending }

// ErrUndecided ends a destination that lost its source after restoring and
// could not learn the outcome before it had to stop; the journal keeps
// phase Restored and the agent asks again when it starts.
var ErrUndecided = errors.New("the source's decision is unknown; asked again when the agent starts")

// Step advances the machine by one event and returns the actions to take
// (see Source.Step).
func (d *Dest) Step(ev Event) ([]Action, error) {
	if d.phase.Final() {
		return nil, unexpected(RoleDestination, d.phase, d.pending, ev)
	}
	if d.pending == 0 {
		if ev.Kind != EvStart || d.phase != "" {
			return nil, unexpected(RoleDestination, d.phase, d.pending, ev)
		}
		return d.to(Preparing, ActSetupDest), nil
	}
	if ev.Kind == EvJournalFailed {
		// Before the commit a destination that cannot keep its record
		// gives up (the source has not committed: it waits for the
		// report that follows the record). A failed record of the commit
		// itself is not fed back: the source's journal decides then.
		switch d.pending {
		case ActSetupDest, ActAckPrepared, ActReceive, ActRestore, ActReportRestored:
			return d.destroy(failure(ev), true), nil
		}
		return nil, unexpected(RoleDestination, d.phase, d.pending, ev)
	}
	switch d.pending {
	case ActSetupDest:
		switch ev.Kind {
		case EvPrepared:
			return d.to(Prepared, ActAckPrepared), nil
		case EvFailed:
			return d.destroy(ev.Err, true), nil
		}
	case ActAckPrepared:
		switch ev.Kind {
		case EvFrozen:
			d.phase, d.pending = Frozen, ActReceive
			return []Action{journal(Frozen), act(ActTakeTraffic), act(ActReceive)}, nil
		case EvFailed, EvPeerAborted:
			return d.destroy(failure(ev), ev.Kind == EvFailed), nil
		}
	case ActReceive:
		switch ev.Kind {
		case EvSent:
			return d.to(Transferred, ActRestore), nil
		case EvFailed, EvPeerAborted:
			return d.destroy(failure(ev), ev.Kind == EvFailed), nil
		}
	case ActRestore:
		switch ev.Kind {
		case EvRestored:
			return d.to(Restored, ActReportRestored), nil
		case EvFailed:
			return d.destroy(ev.Err, true), nil
		}
	case ActReportRestored:
		switch ev.Kind {
		case EvCommit:
			return d.commit(true), nil
		case EvPeerAborted:
			// The source said it keeps the service.
			return d.destroy(failure(ev), false), nil
		case EvFailed:
			// The source is gone or silent: its journal decides. The
			// copy stays, its packets held, until it answers.
			d.pending = ActAskSource
			return []Action{act(ActAskSource)}, nil
		}
	case ActAskSource:
		switch ev.Kind {
		case EvSourceCommitted:
			return d.commit(false), nil
		case EvSourceRolledBack:
			return d.destroy(errors.New("the source kept the service"), false), nil
		case EvFailed:
			// Stopping while undecided: the journal keeps Restored.
			d.pending = 0
			return []Action{finish(OutcomeUndecided, errors.Join(ErrUndecided, ev.Err))}, nil
		}
	case ActAwaitLazy:
		switch ev.Kind {
		case EvLazyDone, EvFailed:
			d.lazyErr = ev.Err
			return d.end(Done, OutcomeOK, d.lazyErr), nil
		}
	case ActDestroy:
		switch ev.Kind {
		case EvDestroyed:
			return d.end(Aborted, OutcomeAborted, d.cause), nil
		case EvFailed:
			return d.end(Aborted, OutcomeAborted, errors.Join(d.cause, ev.Err)), nil
		}
	}
	return nil, unexpected(RoleDestination, d.phase, d.pending, ev)
}

// OutcomeUndecided ends a destination that could not learn the source's
// decision (ErrUndecided).
const OutcomeUndecided Outcome = "undecided"

func (d *Dest) to(p Phase, k ActionKind) []Action {
	d.phase, d.pending = p, k
	return []Action{journal(p), act(k)}
}

// commit makes the service this node's: persisted, then its held packets
// delivered. ack says whether the source still listens for the answer.
func (d *Dest) commit(ack bool) []Action {
	d.phase = Committed
	acts := []Action{journal(Committed), act(ActReleaseHeld)}
	if ack {
		acts = append(acts, act(ActAckCommit))
	}
	if d.strategy.Lazy() {
		d.pending = ActAwaitLazy
		return append(acts, act(ActAwaitLazy))
	}
	return append(acts, d.end(Done, OutcomeOK, nil)...)
}

// destroy removes the copy and what was prepared; tellPeer when the
// failure is this side's.
func (d *Dest) destroy(err error, tellPeer bool) []Action {
	d.cause = err
	var acts []Action
	if tellPeer {
		acts = append(acts, Action{Kind: ActAbortPeer, Err: err})
	}
	d.pending = ActDestroy
	return append(acts, act(ActDestroy))
}

func (d *Dest) end(p Phase, o Outcome, err error) []Action {
	d.phase, d.pending = p, 0
	return []Action{journal(p), finish(o, err)}
}

// RecoverDest returns the machine of an incoming migration an agent
// journaled in phase p before it stopped, and the actions that settle it.
// Before Restored the source cannot have committed (it commits only on
// this side's report, which follows the journal entry): the copy is
// destroyed. Restored asks the source's journal. Committed completes:
// the held packets are delivered.
func RecoverDest(p Phase) (*Dest, []Action) {
	// The lazy tail of a post-copy migration (the daemon's tunnel to the
	// source) died with the agent: nothing to wait for.
	d := &Dest{strategy: StopAndCopy, phase: p}
	switch p {
	case "", Preparing, Prepared, LiveRounds, Frozen, Transferred:
		return d, d.destroy(errors.New("the destination agent restarted before the restore was reported"), false)
	case Restored:
		d.pending = ActAskSource
		return d, []Action{act(ActAskSource)}
	case Committed:
		return d, d.commit(false)
	}
	return d, nil
}

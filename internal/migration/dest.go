package migration

import (
	"errors"
)

// Dest is the destination side of one migration as a pure state machine
// (see Source). The destination holds every packet for the service, in
// and out, from the freeze until the source's commit is in its own
// journal: before that its restored copy answers nobody. It keeps a
// restored copy unless the source says it rolled back, and it hands the
// service back (destroys its copy, then tells the source) when its
// restore fails. Not safe for concurrent use.
type Dest struct {
	strategy Strategy
	phase    Phase
	pending  ActionKind
	cause    error // why the copy is destroyed
	handBack bool  // tell the source once the copy is gone
	lazyErr  error
}

// NewDest returns the machine of an incoming migration with strategy s.
func NewDest(s Strategy) *Dest { return &Dest{strategy: s} }

// Phase is where the destination stands.
func (d *Dest) Phase() Phase { return d.phase }

// Pending is the action whose outcome Step expects next.
func (d *Dest) Pending() ActionKind { return d.pending }

// ErrUndecided ends a side that lost its peer and could not learn the
// outcome before it had to stop; the journal keeps the phase and the
// agent asks again when it starts.
var ErrUndecided = errors.New("the peer's decision is unknown; asked again when the agent starts")

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
		// gives up; its copy never answered. A failed record of the
		// commit itself is not fed back: the source's journal decides.
		switch d.pending {
		case ActSetupDest, ActAckPrepared, ActReceive, ActRestore, ActAwaitCommit:
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
			return d.to(Restored, ActAwaitCommit), nil
		case EvFailed:
			// Hand the service back: the copy goes first, then the
			// source hears it may resume.
			return d.destroy(ev.Err, true), nil
		case EvPeerAborted:
			// The source rolled back while the copy was being restored
			// (a group's other member failed): the restore was stopped.
			return d.destroy(failure(ev), false), nil
		}
	case ActAwaitCommit:
		switch ev.Kind {
		case EvCommit:
			return d.commit(true), nil
		case EvPeerAborted:
			// The source rolled back (before its commit).
			return d.destroy(failure(ev), false), nil
		case EvFailed:
			// The source is gone or silent: its journal decides. The
			// copy stays, its packets held, until it answers.
			d.pending = ActAskSource
			return []Action{act(ActAskSource)}, nil
		}
	case ActAskSource:
		switch ev.Kind {
		case EvPeerCommitted:
			return d.commit(false), nil
		case EvPeerGaveUp:
			return d.destroy(errors.New("the source kept the service"), false), nil
		case EvFailed:
			// Stopping while undecided: the journal keeps Restored.
			d.pending = 0
			return []Action{finish(OutcomeUndecided, errors.Join(ErrUndecided, ev.Err))}, nil
		}
	case ActAskSourcePages:
		switch ev.Kind {
		case EvPeerCommitted:
			// The source served every page: the copy is whole.
			return d.commit(false), nil
		case EvPeerGaveUp:
			return d.destroy(errors.New("the lazy pages were cut off by the restart and the source holds the service again"), false), nil
		case EvFailed:
			// Stopping while undecided: the journal keeps Committed.
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
			return d.gone(d.cause), nil
		case EvFailed:
			return d.gone(errors.Join(d.cause, ev.Err)), nil
		}
	}
	return nil, unexpected(RoleDestination, d.phase, d.pending, ev)
}

// OutcomeUndecided ends a side that could not learn its peer's decision
// (ErrUndecided).
const OutcomeUndecided Outcome = "undecided"

func (d *Dest) to(p Phase, k ActionKind) []Action {
	d.phase, d.pending = p, k
	return []Action{journal(p), act(k)}
}

// commit makes the service this node's: persisted, then its held packets
// delivered. report says whether the source still listens for the answer.
func (d *Dest) commit(report bool) []Action {
	d.phase = Committed
	acts := []Action{journal(Committed), act(ActReleaseHeld)}
	if report {
		acts = append(acts, act(ActAckCommit))
	}
	if d.strategy.Lazy() {
		d.pending = ActAwaitLazy
		return append(acts, act(ActAwaitLazy))
	}
	return append(acts, d.end(Done, OutcomeOK, nil)...)
}

// destroy removes the copy and what was prepared; handBack when the
// failure is this side's (the source then resumes the service, told once
// the copy is gone and that is journaled).
func (d *Dest) destroy(err error, handBack bool) []Action {
	d.cause = err
	d.pending = ActDestroy
	d.handBack = handBack
	return []Action{act(ActDestroy)}
}

// gone: the copy is destroyed; journaled, then the source told.
func (d *Dest) gone(err error) []Action {
	d.phase, d.pending = Aborted, 0
	acts := []Action{journal(Aborted)}
	if d.handBack {
		acts = append(acts, Action{Kind: ActAbortPeer, Err: err})
	}
	return append(acts, finish(OutcomeAborted, err))
}

func (d *Dest) end(p Phase, o Outcome, err error) []Action {
	d.phase, d.pending = p, 0
	return []Action{journal(p), finish(o, err)}
}

// RecoverDest returns the machine of an incoming migration an agent
// journaled in phase p before it stopped, and the actions that settle it.
// Before Restored nothing of the service ever answered here: the copy is
// destroyed and that journaled, which a committed source reads as the
// service handed back. Restored asks the source's journal. Committed
// completes: the held packets are delivered; with a lazy strategy s only
// once the source says it served every page (ActAskSourcePages): the
// lazy-pages daemon and the proxy died with the agent, so a copy whose
// pages did not all arrive cannot run on, and its source, whose lazy dump
// then failed, holds the service again.
func RecoverDest(s Strategy, p Phase) (*Dest, []Action) {
	// The lazy tail of a post-copy migration (the daemon's tunnel to the
	// source) died with the agent: nothing to wait for.
	d := &Dest{strategy: StopAndCopy, phase: p}
	if p == Committed && s.Lazy() {
		d.pending = ActAskSourcePages
		return d, []Action{act(ActAskSourcePages)}
	}
	switch p {
	case "", Preparing, Prepared, LiveRounds, Frozen, Transferred:
		return d, d.destroy(errors.New("the destination agent restarted before the service was restored"), false)
	case Restored:
		d.pending = ActAskSource
		return d, []Action{act(ActAskSource)}
	case Committed:
		return d, d.commit(false)
	}
	return d, nil
}

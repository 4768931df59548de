package migration

import (
	"errors"
	"fmt"
)

// Source is the source side of one migration as a pure state machine, in
// the manner of etcd's raft: Step takes what happened and returns what to
// do; the agent performs the actions (I/O) and reports their outcome as
// the next event. Not safe for concurrent use.
//
// The commit point is the source's journal entry Committed, written once
// the whole state is sent: before it, any failure past the freeze resumes
// the service here on this side's own decision; after it, the service is
// the destination's once restored, and comes back here only when the
// destination hands it back (its restore failed, its copy is gone). The
// commit travels to the destination right behind the state, so it is
// there before the restore ends and costs the frozen window nothing.
type Source struct {
	strategy Strategy
	phase    Phase
	pending  ActionKind // the action whose outcome Step waits for; 0 before start and when final
	dumped   bool       // the dump completed: a rollback restores from images
	cause    error      // why a rollback runs
	lazyErr  error      // post-copy: pages that did not arrive
	lost     bool       // post-copy: pages failed and no copy runs on the destination
}

// NewSource returns the machine of a migration with strategy s (not Auto:
// the planner resolves it first).
func NewSource(s Strategy) *Source { return &Source{strategy: s} }

// Phase is where the source stands.
func (s *Source) Phase() Phase { return s.phase }

// Pending is the action whose outcome Step expects next.
func (s *Source) Pending() ActionKind { return s.pending }

// PastFreeze reports whether the service was frozen: from then on the
// migration cannot be cancelled, only completed or rolled back.
func (s *Source) PastFreeze() bool {
	switch s.phase {
	case "", Preparing, LiveRounds, Aborted:
		return false
	}
	return true
}

// Step advances the machine by one event and returns the actions to take,
// in order. The last action of a batch is the one whose outcome is the
// next event, or ActFinish.
func (s *Source) Step(ev Event) ([]Action, error) {
	if s.phase.Final() {
		return nil, unexpected(RoleSource, s.phase, s.pending, ev)
	}
	if s.pending == 0 {
		if ev.Kind != EvStart || s.phase != "" {
			return nil, unexpected(RoleSource, s.phase, s.pending, ev)
		}
		return s.to(Preparing, ActPrepare), nil
	}
	if ev.Kind == EvJournalFailed {
		return s.journalFailed(failure(ev))
	}
	switch s.pending {
	case ActPrepare, ActRounds:
		switch ev.Kind {
		case EvPrepared:
			if s.pending == ActPrepare {
				if s.strategy.Live() {
					return s.to(LiveRounds, ActRounds), nil
				}
				return s.to(Frozen, ActFreeze), nil
			}
		case EvRoundsDone:
			if s.pending == ActRounds {
				return s.to(Frozen, ActFreeze), nil
			}
		case EvFailed, EvPeerAborted, EvCancel:
			return s.abort(failure(ev), ev.Kind != EvPeerAborted), nil
		}
	case ActFreeze:
		switch ev.Kind {
		case EvFrozen:
			s.pending = ActDump
			return []Action{act(ActDump)}, nil
		case EvFailed, EvPeerAborted, EvBudget:
			return s.rollback(failure(ev), ev.Kind != EvPeerAborted), nil
		case EvCancel:
			// Cancelled as the freeze began, before anything froze.
			return s.abort(failure(ev), true), nil
		}
	case ActDump:
		switch ev.Kind {
		case EvDumped:
			s.dumped = true
			s.pending = ActSend
			return []Action{act(ActSend)}, nil
		case EvFailed, EvPeerAborted, EvBudget:
			return s.rollback(failure(ev), ev.Kind != EvPeerAborted), nil
		}
	case ActSend:
		switch ev.Kind {
		case EvSent:
			s.phase, s.pending = Committed, ActAwaitOutcome
			return []Action{journal(Committed), act(ActCommit), act(ActAwaitOutcome)}, nil
		case EvFailed, EvPeerAborted, EvBudget:
			return s.rollback(failure(ev), ev.Kind != EvPeerAborted), nil
		}
	case ActAwaitOutcome, ActAskDest:
		// Committed: no rollback on this side's own account any more.
		switch ev.Kind {
		case EvSwitched, EvPeerCommitted:
			return s.served(), nil
		case EvPeerAborted, EvPeerGaveUp:
			// Handed back: the destination holds no copy.
			s.cause = failure(ev)
			if ev.Kind == EvPeerGaveUp && ev.Err == nil {
				s.cause = errors.New("the destination holds no copy")
			}
			s.pending = ActRestoreLocal
			return []Action{act(ActRestoreLocal)}, nil
		case EvFailed:
			if s.pending == ActAwaitOutcome {
				// The destination is silent: its journal decides.
				s.pending = ActAskDest
				return []Action{act(ActAskDest)}, nil
			}
			// Stopping while undecided: the journal keeps Committed.
			s.pending = 0
			return []Action{finish(OutcomeUndecided, errors.Join(ErrUndecided, ev.Err))}, nil
		}
	case ActAwaitLazy:
		switch ev.Kind {
		case EvLazyDone:
			s.pending = ActRelease
			return []Action{act(ActRelease)}, nil
		case EvFailed:
			// Pages that did not all arrive may have taken the
			// destination's copy with them (its agent restarted and
			// its lazy-pages daemon died): "ok" only if it runs.
			s.lazyErr = failure(ev)
			s.pending = ActCheckDest
			return []Action{act(ActCheckDest)}, nil
		}
	case ActCheckDest:
		switch ev.Kind {
		case EvPeerDestroyed:
			// The destination's copy is gone for good and the tasks
			// are here, memory intact: take the service back (thawed,
			// listed and announced here again, as after a hand-back).
			// What the copy answered since its restore is not here:
			// the result says so.
			s.cause = fmt.Errorf("taken back from the destination, whose lazy pages were cut off (%w): the service resumed with its memory as frozen, and whatever the destination's copy acknowledged after its restore is lost", s.lazyErr)
			s.pending = ActRestoreLocal
			return []Action{act(ActRestoreLocal)}, nil
		case EvPeerCommitted:
		case EvPeerGaveUp, EvFailed:
			s.lost = true
			if ev.Err != nil {
				s.lazyErr = errors.Join(s.lazyErr, ev.Err)
			}
		default:
			return nil, unexpected(RoleSource, s.phase, s.pending, ev)
		}
		s.pending = ActRelease
		return []Action{act(ActRelease)}, nil
	case ActRelease:
		switch ev.Kind {
		case EvReleased, EvFailed:
			// A cleanup failure leaves files behind, not a service.
			if s.lost {
				return s.end(Lost, OutcomeLost, s.lazyErr), nil
			}
			return s.end(Done, OutcomeOK, s.lazyErr), nil
		}
	case ActResume, ActRestoreLocal:
		switch ev.Kind {
		case EvResumed:
			return s.end(RolledBack, OutcomeRolledBack, s.cause), nil
		case EvFailed:
			return s.end(Lost, OutcomeLost, errors.Join(s.cause, ev.Err)), nil
		}
	}
	return nil, unexpected(RoleSource, s.phase, s.pending, ev)
}

// served: the destination serves the service; the source waits for the
// lazy pages it still serves, then lets go.
func (s *Source) served() []Action {
	if s.strategy.Lazy() {
		s.pending = ActAwaitLazy
		return []Action{act(ActAwaitLazy)}
	}
	s.pending = ActRelease
	return []Action{act(ActRelease)}
}

// journalFailed answers a phase that could not be persisted: the action
// after it was not taken, and without the record a crash could not be
// settled, so the migration gives up the way its phase allows. A commit
// that is not on disk did not happen.
func (s *Source) journalFailed(err error) ([]Action, error) {
	switch s.pending {
	case ActPrepare, ActRounds:
		return s.abort(err, true), nil
	case ActFreeze:
		return s.rollback(err, true), nil // nothing frozen yet: resume is a no-op
	case ActAwaitOutcome:
		s.phase = Frozen
		return s.rollback(err, true), nil
	}
	return nil, unexpected(RoleSource, s.phase, s.pending, Event{Kind: EvJournalFailed, Err: err})
}

// to enters phase p (journaled first) and starts awaited action k.
func (s *Source) to(p Phase, k ActionKind) []Action {
	s.phase, s.pending = p, k
	return []Action{journal(p), act(k)}
}

// abort gives up before the freeze: the service never stopped.
func (s *Source) abort(err error, tellPeer bool) []Action {
	var acts []Action
	if tellPeer {
		acts = append(acts, Action{Kind: ActAbortPeer, Err: err})
	}
	return append(acts, s.end(Aborted, OutcomeAborted, err)...)
}

// rollback gives up past the freeze and before the commit: the service
// resumes here, from its images once the dump completed.
func (s *Source) rollback(err error, tellPeer bool) []Action {
	s.cause = err
	var acts []Action
	if tellPeer {
		acts = append(acts, Action{Kind: ActAbortPeer, Err: err})
	}
	s.pending = ActResume
	if s.dumped {
		s.pending = ActRestoreLocal
	}
	return append(acts, act(s.pending))
}

func (s *Source) end(p Phase, o Outcome, err error) []Action {
	s.phase, s.pending = p, 0
	return []Action{journal(p), finish(o, err)}
}

// RecoverSource returns the machine of a migration an agent journaled in
// phase p before it stopped, and the actions that settle it. handOver
// says whether the destination has the whole state: it reports the
// service restored and waiting for a commit that never came, or the
// service's group committed (every member had sent its state). Then,
// unless the strategy is lazy (its pages were served by the dump that
// died with the agent), the service is handed over instead of restored
// here.
//
// Before the freeze nothing changed: the migration is aborted. Frozen (not
// committed): the service resumes here (thawed, or restored from its
// images), or is handed over. Committed: the destination's journal says
// whether it serves the service or holds nothing (then it resumes here).
func RecoverSource(s Strategy, p Phase, handOver bool) (*Source, []Action) {
	m := &Source{strategy: s, phase: p}
	if s.Lazy() {
		// The lazy dump died with the agent: no pages to wait for.
		m.strategy = StopAndCopy
	}
	switch p {
	case "", Preparing, LiveRounds:
		return m, m.abort(errors.New("the source agent restarted before the freeze"), true)
	case Frozen, Transferred:
		if handOver && !s.Lazy() {
			m.phase, m.pending = Committed, ActAskDest
			return m, []Action{journal(Committed), act(ActAskDest)}
		}
		// Whether the dump completed is not journaled: the rollback
		// looks at the service itself (running or frozen: thaw; gone:
		// restore from images).
		m.dumped = true
		return m, m.rollback(errors.New("the source agent restarted past the freeze"), true)
	case Committed:
		m.pending = ActAskDest
		return m, []Action{act(ActAskDest)}
	}
	return m, nil // final: nothing to do
}

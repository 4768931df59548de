package migration

import (
	"errors"
	"fmt"
)

// Phase is where one side of a migration stands. Each side persists its
// phase (the agent's journal) before it acts on it, so an agent that
// restarts knows what the service may look like: Recover says what to do.
type Phase string

// The phases of both sides, in the order a successful migration passes
// them. A side ends in Done, Aborted, RolledBack or Lost.
const (
	// Preparing: the source asked the destination to get ready; the
	// destination builds the namespace, the packet holder and the bundle.
	// The service runs on the source, untouched.
	Preparing Phase = "preparing"
	// Prepared: the destination is ready (destination only).
	Prepared Phase = "prepared"
	// LiveRounds: memory and writable layer are copied while the service
	// runs (pre-copy, hybrid).
	LiveRounds Phase = "live-rounds"
	// Frozen: the source froze the service and dumps it; the destination
	// has taken the service's traffic and holds every packet.
	Frozen Phase = "frozen"
	// Transferred: the state is on the destination.
	Transferred Phase = "transferred"
	// Restored: the destination restored the service; its packets are
	// still held, so it answers nobody until the commit.
	Restored Phase = "restored"
	// Committed: the service belongs to the destination. The source's
	// Committed is the commit point of the whole migration.
	Committed Phase = "committed"
	// Done: the migration ended well; the source holds nothing of the
	// service (post-copy: every page arrived).
	Done Phase = "done"
	// Aborted: given up before anything changed for the service (source:
	// before the freeze; destination: its copy destroyed).
	Aborted Phase = "aborted"
	// RolledBack: the source resumed the service after a failure past the
	// freeze.
	RolledBack Phase = "rolled-back"
	// Lost: a rollback failed; the service runs nowhere.
	Lost Phase = "lost"
)

// Final reports whether a side in phase p has nothing left to do.
func (p Phase) Final() bool {
	switch p {
	case Done, Aborted, RolledBack, Lost:
		return true
	}
	return false
}

// Outcome is the outcome a side ending in phase p had; "" for a phase
// that is not final.
func (p Phase) Outcome() Outcome {
	switch p {
	case Done:
		return OutcomeOK
	case Aborted:
		return OutcomeAborted
	case RolledBack:
		return OutcomeRolledBack
	case Lost:
		return OutcomeLost
	}
	return ""
}

// Valid reports whether p is one of the phases.
func (p Phase) Valid() bool {
	switch p {
	case Preparing, Prepared, LiveRounds, Frozen, Transferred, Restored, Committed, Done, Aborted, RolledBack, Lost:
		return true
	}
	return false
}

// Role is the side of a migration an agent plays.
type Role string

// The two sides.
const (
	RoleSource      Role = "source"
	RoleDestination Role = "destination"
)

// EventKind is what happened, as the driver reports it to Step.
type EventKind int

// Events. Each answers the action the machine is waiting on (Pending).
const (
	EvStart         EventKind = iota + 1
	EvPrepared                // the destination is ready (source), or prepared itself (destination)
	EvRoundsDone              // the live rounds ended (source)
	EvFrozen                  // the service is frozen (source), or the source announced the freeze (destination)
	EvDumped                  // the dump is complete, or (lazy) its page server is up
	EvSent                    // images and writable layer are sent (source) or received (destination)
	EvRestored                // the destination restored the service (its packets still held)
	EvCommit                  // the source committed (destination)
	EvSwitched                // the destination serves the service (source)
	EvLazyDone                // post-copy: every page reached the destination
	EvResumed                 // the source runs the service again (rollback)
	EvReleased                // the source freed what it held of the service
	EvDestroyed               // the destination removed its copy
	EvPeerCommitted           // asked after losing the peer: it committed (source's journal) or serves (destination's)
	EvPeerGaveUp              // asked after losing the peer: it rolled back (source) or holds no copy (destination)
	EvFailed                  // the pending action failed (Err)
	EvPeerAborted             // the peer gave up (Err carries its reason)
	EvCancel                  // the operator cancelled
	EvBudget                  // the frozen-window budget ran out
	// EvJournalFailed: the phase just entered could not be persisted, so
	// the action after it was not taken.
	EvJournalFailed
	// EvPeerDestroyed (source, post-copy pages failed): the destination
	// destroyed its copy and journaled that (its record final, not done,
	// the container gone), and the service's tasks are still here: CRIU
	// resumed them when its lazy page server's session failed.
	EvPeerDestroyed
)

var eventNames = map[EventKind]string{
	EvStart: "start", EvPrepared: "prepared", EvRoundsDone: "rounds-done", EvFrozen: "frozen",
	EvDumped: "dumped", EvSent: "sent", EvRestored: "restored", EvCommit: "commit", EvSwitched: "switched",
	EvLazyDone: "lazy-done", EvResumed: "resumed", EvReleased: "released", EvDestroyed: "destroyed",
	EvPeerCommitted: "peer-committed", EvPeerGaveUp: "peer-gave-up", EvPeerDestroyed: "peer-destroyed",
	EvFailed: "failed", EvPeerAborted: "peer-aborted", EvCancel: "cancel", EvBudget: "budget",
	EvJournalFailed: "journal-failed",
}

func (k EventKind) String() string {
	if n, ok := eventNames[k]; ok {
		return n
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// Event is one input to Step.
type Event struct {
	Kind EventKind
	Err  error // EvFailed, EvPeerAborted, EvBudget: why
}

// ActionKind is what the driver must do.
type ActionKind int

// Actions. The driver performs a batch in order; the last action of a
// batch that is not ActFinish is awaited: its outcome is the next event.
const (
	// ActJournal persists Action.Phase before anything after it acts.
	ActJournal ActionKind = iota + 1
	// Source actions.
	ActPrepare      // connect, send the service's description, await the destination's readiness
	ActRounds       // copy memory and writable layer while the service runs
	ActFreeze       // hand the traffic to the destination, freeze, lock the network
	ActDump         // checkpoint (lazy: until the page server is up)
	ActSend         // send images and writable layer (pre-copy: only the delta)
	ActCommit       // tell the destination the service is its own once restored
	ActAwaitOutcome // wait until the destination serves the service, or hands it back
	ActAskDest      // the destination is silent: ask its journal until it serves or holds nothing
	ActAwaitLazy    // post-copy: wait until every page was served
	ActCheckDest    // post-copy pages failed: ask the destination whether its copy runs
	ActRelease      // free the source's remains of the service
	ActResume       // the dump failed: thaw, unlock and take the traffic back
	ActRestoreLocal // restore the service on the source (thaw it, or from its images)
	ActAbortPeer    // tell the peer this side gives up (best effort)
	// Destination actions.
	ActSetupDest   // namespace, holder, bundle, store
	ActAckPrepared // tell the source it is ready; await the freeze (storing live rounds)
	ActTakeTraffic // point the overlay here (packets held)
	ActReceive     // receive (or rebuild) images and writable layer
	ActRestore     // restore the service
	ActAwaitCommit // wait for the source's commit (normally already here)
	ActReleaseHeld // deliver the held packets, record the service as its own
	ActAckCommit   // tell the source the service is served here, with the restore's account
	ActAskSource   // the source is silent: ask its journal until it committed or rolled back
	ActDestroy     // remove the copy and everything prepared
	ActFinish      // the migration ended: Action.Outcome, Action.Err
	// ActAskSourcePages: a restart cut the lazy tail of a committed
	// post-copy copy; ask the source whether it served every page (its
	// journal done: the copy is whole) or holds the service again (its
	// lazy dump failed and CRIU resumed the tasks: the copy goes).
	ActAskSourcePages
)

var actionNames = map[ActionKind]string{
	ActJournal: "journal", ActPrepare: "prepare", ActRounds: "live rounds", ActFreeze: "freeze",
	ActDump: "dump", ActSend: "send state", ActCommit: "commit", ActAwaitOutcome: "await destination",
	ActAskDest: "ask destination", ActAwaitLazy: "await lazy pages", ActCheckDest: "check destination's copy", ActRelease: "release source",
	ActResume: "resume", ActRestoreLocal: "restore on source", ActAbortPeer: "abort peer",
	ActSetupDest: "set up", ActAckPrepared: "ack prepared, await freeze", ActTakeTraffic: "take traffic (held)",
	ActReceive: "receive state", ActRestore: "restore", ActAwaitCommit: "await commit",
	ActReleaseHeld: "release held packets", ActAckCommit: "report serving", ActAskSource: "ask source",
	ActDestroy: "destroy copy", ActFinish: "finish", ActAskSourcePages: "ask source for pages",
}

func (k ActionKind) String() string {
	if n, ok := actionNames[k]; ok {
		return n
	}
	return fmt.Sprintf("action(%d)", int(k))
}

// Outcome is how a migration ended.
type Outcome string

// Outcomes.
const (
	OutcomeOK         Outcome = "ok"          // the service runs on the destination
	OutcomeAborted    Outcome = "aborted"     // given up before the freeze: the service ran on untouched
	OutcomeRolledBack Outcome = "rolled-back" // failed after the freeze: the service resumed on the source
	OutcomeLost       Outcome = "lost"        // the rollback failed too
)

// Action is one thing the driver must do.
type Action struct {
	Kind    ActionKind
	Phase   Phase   // ActJournal: the phase to persist
	Outcome Outcome // ActFinish
	Err     error   // ActFinish: why it did not end well; ActAbortPeer: the reason to send
}

func (a Action) String() string {
	switch a.Kind {
	case ActJournal:
		return "journal " + string(a.Phase)
	case ActFinish:
		if a.Err != nil {
			return fmt.Sprintf("finish %s (%v)", a.Outcome, a.Err)
		}
		return "finish " + string(a.Outcome)
	}
	return a.Kind.String()
}

// ErrUnexpected is returned by Step for an event that does not answer
// the pending action: a driver bug, never a peer's doing.
var ErrUnexpected = errors.New("unexpected event")

// ErrFrozenBudget is the cause of a rollback because the service stayed
// frozen longer than the migration's budget.
var ErrFrozenBudget = errors.New("frozen-window budget exhausted")

func journal(p Phase) Action  { return Action{Kind: ActJournal, Phase: p} }
func act(k ActionKind) Action { return Action{Kind: k} }
func finish(o Outcome, err error) Action {
	return Action{Kind: ActFinish, Outcome: o, Err: err}
}

func unexpected(role Role, p Phase, pending ActionKind, ev Event) error {
	return fmt.Errorf("%w: %s in phase %s while waiting for %s: %s", ErrUnexpected, role, p, pending, ev.Kind)
}

func failure(ev Event) error {
	if ev.Err != nil {
		return ev.Err
	}
	switch ev.Kind {
	case EvCancel:
		return errors.New("cancelled")
	case EvBudget:
		return ErrFrozenBudget
	case EvPeerAborted:
		return errors.New("peer aborted")
	}
	return fmt.Errorf("%s", ev.Kind)
}

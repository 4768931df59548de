package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
)

// unit coordinates the members of a group that migrate as one, each in
// its own job: none freezes before every member is ready to, and none
// commits before every member has sent its state, so a member that fails
// up to that point makes every other one roll back (or abort) on the
// source. Their frozen-window budget is the whole unit's. Once every
// member has sent its state, the last to arrive records the unit's commit
// (commit: in the journal) before any member goes on, so that an agent
// restarted in the middle commits every member rather than some.
type unit struct {
	id      string
	group   string
	members []string
	commit  func() error // records the unit's commit; nil: nothing to record

	// dependents lists, for each member, the members that depend on it
	// (name it in their After): it freezes only after they have.
	dependents map[string][]string

	mu      sync.Mutex      // guards the fields below
	arrived map[stage]int   // members that reached each stage
	frozen  map[string]bool // members frozen (awaitDependentsFrozen)
	podNet  bool            // a member took the pod's network (takePodNetwork)
	// loop is a pod's hold of its loopback (outgoing.holdLoopback),
	// ended by the last member to finish (memberDone).
	loop     *netplane.Holder
	finished int   // members whose migration ended
	notOK    bool  // one of them did not move
	bytes    int64 // the members' state, as each reported it at the freeze
	failed   error
	changed  notifier
}

// stage is a barrier of a unit's migration.
type stage int

const (
	stageFreeze stage = iota // ready to freeze
	stageSent                // state sent, ready to commit
)

func newUnit(group string, members []string) *unit {
	return &unit{id: journal.NewID(), group: group, members: members, arrived: map[stage]int{}, frozen: map[string]bool{}}
}

// orderFreeze makes every member freeze after the members that depend on
// it (after: member → the members it depends on). A web tier that opens
// a connection to its database per request then makes none once the
// database is frozen: the database accepts the last ones before it
// freezes, and no connection between them is half-made at the dump.
// Dependencies outside the unit, and any that form a cycle, are ignored.
func (u *unit) orderFreeze(after map[string][]string) {
	u.dependents = map[string][]string{}
	for _, m := range u.members {
		for _, d := range after[m] {
			if d != m && slices.Contains(u.members, d) && !dependsOn(after, d, m, len(u.members)) {
				u.dependents[d] = append(u.dependents[d], m)
			}
		}
	}
}

// dependsOn reports whether a depends on b, directly or not, in at most
// depth steps.
func dependsOn(after map[string][]string, a, b string, depth int) bool {
	if depth == 0 {
		return false
	}
	for _, d := range after[a] {
		if d == b || dependsOn(after, d, b, depth-1) {
			return true
		}
	}
	return false
}

// awaitDependentsFrozen waits until every member that depends on member
// is frozen, or the unit failed, or ctx ends.
func (u *unit) awaitDependentsFrozen(ctx context.Context, member string) error {
	u.mu.Lock()
	return u.await(ctx, func() bool {
		for _, d := range u.dependents[member] {
			if !u.frozen[d] {
				return false
			}
		}
		return true
	})
}

// takePodNetwork reports whether the caller, a pod's member about to
// freeze, is the first: it then does the network's part of the pod's
// migration (hold of new connections and of loopback, traffic handover,
// link down). Whichever member freezes first, its dump is the first that
// could end a connection, so the network must be held from its freeze.
func (u *unit) takePodNetwork() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	first := !u.podNet
	u.podNet = true
	return first
}

// holdLoop hands the unit the pod's hold of its loopback.
func (u *unit) holdLoop(h *netplane.Holder) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.loop = h
}

// memberDone records that a member's migration ended (ok: it moved). The
// last one ends the pod's hold of its loopback: its packets are dropped
// if every member moved (their senders' queues went with the dumps),
// let through otherwise, once every member runs here again (one resumed
// earlier would have sent to another not restored yet, whose missing
// socket answers with a reset).
func (u *unit) memberDone(ok bool, log *slog.Logger) {
	u.mu.Lock()
	u.finished++
	u.notOK = u.notOK || !ok
	var h *netplane.Holder
	if u.finished == len(u.members) {
		h, u.loop = u.loop, nil
	}
	drop := !u.notOK
	u.mu.Unlock()
	switch {
	case h == nil:
	case drop:
		_ = h.Drop()
	default:
		if err := h.Close(); err != nil {
			log.Warn("let the pod's held loopback packets through", "group", u.group, "err", err)
		}
	}
}

// markFrozen records that member is frozen.
func (u *unit) markFrozen(member string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.frozen[member] = true
	u.changed.notify()
}

// arrive records that a member reached s (with its state's size at the
// freeze) and waits until every member has, or one has failed, or ctx
// ends.
func (u *unit) arrive(ctx context.Context, s stage, bytes int64) error {
	u.mu.Lock()
	u.arrived[s]++
	u.bytes += bytes
	if s == stageSent && u.arrived[s] == len(u.members) && u.failed == nil && u.commit != nil {
		if err := u.commit(); err != nil {
			u.failed = fmt.Errorf("recording its commit failed: %w", err)
		}
	}
	u.changed.notify()
	return u.await(ctx, func() bool { return u.arrived[s] >= len(u.members) })
}

// await waits until ready (called with u.mu held) is true, or a member
// failed, or ctx ends (which fails the unit). It is called with u.mu held
// and returns with it released.
func (u *unit) await(ctx context.Context, ready func() bool) error {
	for {
		if u.failed != nil {
			err := u.failed
			u.mu.Unlock()
			return fmt.Errorf("group %s moves as one and %w", u.group, err)
		}
		if ready() {
			u.mu.Unlock()
			return nil
		}
		ch := u.changed.wait()
		u.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			err := context.Cause(ctx)
			u.fail("the unit", err)
			return err
		}
		u.mu.Lock()
	}
}

// fail records a member's failure; members waiting at a barrier give up.
func (u *unit) fail(member string, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.failed == nil {
		u.failed = fmt.Errorf("%s failed: %w", member, err)
		u.changed.notify()
	}
}

// budget is the unit's frozen-window budget: every member's state
// crosses the same link while all of them are frozen.
func (u *unit) budget(linkBps int64) time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	return migration.FrozenBudget(u.bytes, linkBps)
}

// StartGroupMigration moves every container of group on this node to
// req.To as one unit (see unit): one job per member, all sharing the
// request. It claims every member first and starts nothing if one cannot
// be migrated.
func (a *Agent) StartGroupMigration(group string, req migration.Request) ([]*job, error) {
	if err := checkRequest(a.cfg.Node, req); err != nil {
		return nil, err
	}
	a.mu.Lock()
	var names []string
	for n, c := range a.containers {
		if c.meta.Group == group {
			names = append(names, n)
		}
	}
	a.mu.Unlock()
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: no container of group %q on %s (see 'edgehop ps')", ErrNotFound, group, a.cfg.Node)
	}
	sort.Strings(names)
	var claimed []string
	release := func() {
		for _, n := range claimed {
			a.release(n)
		}
	}
	var outs []*outgoing
	u := newUnit(group, names)
	after := map[string][]string{}
	a.mu.Lock()
	for _, n := range names {
		if c := a.containers[n]; c != nil {
			after[n] = c.meta.After
		}
	}
	a.mu.Unlock()
	u.orderFreeze(after)
	u.commit = func() error {
		if err := a.journal.CommitUnit(u.id); err != nil {
			return err
		}
		a.failpoint("unit-committed") // before any member's own commit
		return nil
	}
	for _, name := range names {
		o, err := a.newOutgoing(name, req)
		if err != nil {
			release()
			return nil, fmt.Errorf("group %s cannot move: %w", group, err)
		}
		claimed = append(claimed, name)
		o.unit, o.rec.Unit = u, u.id
		o.cleanup = append(o.cleanup, func() { u.memberDone(o.res.OK, a.log) })
		outs = append(outs, o)
	}
	var jobs []*job
	for _, o := range outs {
		jobs = append(jobs, a.runOutgoing(o))
	}
	a.log.Info("group migration", "group", group, "members", names, "to", req.To, "unit", u.id)
	return jobs, nil
}

// dependencies of the members being restored here, by unit: a member is
// released only once the members it depends on are restored.
type restoredSet struct {
	mu      sync.Mutex
	units   map[string]map[string]time.Time // unit -> member -> when restored
	failed  map[string]map[string]bool      // unit -> member whose copy here was given up
	changed notifier
}

func (r *restoredSet) mark(unitID, member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.units == nil {
		r.units = map[string]map[string]time.Time{}
	}
	for id, m := range r.units { // forget units long settled
		for _, t := range m {
			if time.Since(t) > 10*time.Minute {
				delete(r.units, id)
			}
			break
		}
	}
	if r.units[unitID] == nil {
		r.units[unitID] = map[string]time.Time{}
	}
	r.units[unitID][member] = time.Now()
	r.changed.notify()
}

// markFailed records that member's copy here was given up (and forgets
// it was restored).
func (r *restoredSet) markFailed(unitID, member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed == nil {
		r.failed = map[string]map[string]bool{}
	}
	for id := range r.failed { // forget units no member was restored of lately
		if _, ok := r.units[id]; !ok && id != unitID {
			delete(r.failed, id)
		}
	}
	if r.failed[unitID] == nil {
		r.failed[unitID] = map[string]bool{}
	}
	r.failed[unitID][member] = true
	delete(r.units[unitID], member)
	r.changed.notify()
}

// awaitAll waits until every member of the unit is restored here; it
// fails as soon as one's copy is given up, or after max, or with ctx.
func (r *restoredSet) awaitAll(ctx context.Context, unitID string, members []string, max time.Duration) error {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var missing, failed []string
		for _, m := range members {
			if r.failed[unitID][m] {
				failed = append(failed, m)
			} else if _, ok := r.units[unitID][m]; !ok {
				missing = append(missing, m)
			}
		}
		ch := r.changed.wait()
		r.mu.Unlock()
		switch {
		case len(failed) > 0:
			return fmt.Errorf("%v could not be restored here", failed)
		case len(missing) == 0:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %v: %w", missing, context.Cause(ctx))
		case <-deadline.C:
			return fmt.Errorf("%v not restored here within %s", missing, max)
		}
	}
}

// await waits until every dependency of a member that is part of the
// unit is restored here, at most max; it returns those still missing.
func (r *restoredSet) await(ctx context.Context, unitID string, members, deps []string, max time.Duration) []string {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var missing []string
		for _, d := range deps {
			if _, ok := r.units[unitID][d]; !ok && slices.Contains(members, d) {
				missing = append(missing, d)
			}
		}
		ch := r.changed.wait()
		r.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return missing
		case <-deadline.C:
			return missing
		}
	}
}

// unitDepsWait bounds how long a restored member waits for the members it
// depends on before it serves anyway (their migrations failed; the unit
// goes back to the source).
const unitDepsWait = 30 * time.Second

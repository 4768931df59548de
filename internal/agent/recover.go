package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/runc"
)

// pendingRecoveries reads the journal of an agent that starts and claims
// the containers of every migration a crash interrupted, so that nothing
// else touches them until recoverAll settled them. Incoming containers
// without an unsettled record (never journaled, or settled) go.
func (a *Agent) pendingRecoveries(ctx context.Context) ([]journal.Record, error) {
	recs, bad, err := a.journal.Scan()
	if err != nil {
		return nil, err
	}
	var pending []journal.Record
	active := map[string]bool{}
	// An unreadable record quarantines its migration: nothing of it is
	// destroyed, its container stays claimed until an operator settles it
	// and removes the log. One naming no container keeps every leftover.
	keepAll := false
	for _, u := range bad {
		a.metrics.Recovered("quarantined")
		a.log.Error("journal record unreadable: its migration is quarantined and its data kept; settle the container by hand, then remove the log",
			"migration", u.ID, "log", u.Path, "container", u.Container, "err", u.Err)
		if u.Container == "" {
			keepAll = true
			continue
		}
		active[u.Container] = true
		a.mu.Lock()
		a.busy[u.Container] = true
		a.mu.Unlock()
	}
	// The newest record of each container: a destination's Done means
	// its copy is the service, whatever its meta still says.
	newest := map[string]journal.Record{}
	for _, r := range recs {
		if o, ok := newest[r.Container]; !ok || !r.Updated.Before(o.Updated) {
			newest[r.Container] = r
		}
	}
	for _, r := range recs {
		if r.Phase.Final() {
			continue
		}
		pending = append(pending, r)
		active[r.Container] = true
		a.mu.Lock()
		a.busy[r.Container] = true
		if c, ok := a.containers[r.Container]; ok && r.Role == migration.RoleSource && r.Phase != migration.Preparing && r.Phase != migration.LiveRounds {
			// Possibly the destination's now: not listed as living here
			// until settled.
			c.handedOver = true
		}
		a.mu.Unlock()
	}
	if keepAll {
		a.log.Error("an unreadable journal record names no container: every incoming container and scratch entry is kept")
	} else {
		a.sweepScratch(active)
	}
	for _, name := range a.incomingLeftovers() {
		if active[name] {
			continue
		}
		if r, ok := newest[name]; ok && r.Role == migration.RoleDestination && r.Phase == migration.Done {
			// Committed and done here, but the agent stopped before its
			// meta said so (adopt's write failed or never ran).
			a.log.Warn("adopting a committed container whose record still said incoming", "container", name, "migration", r.ID)
			a.metrics.Recovered("adopted")
			a.adopt(&container{meta: a.readMeta(name)})
			continue
		}
		if keepAll {
			a.log.Warn("incoming container kept: an unreadable journal record may be its", "container", name)
			a.mu.Lock()
			a.busy[name] = true
			a.mu.Unlock()
			continue
		}
		a.log.Info("discarding an incoming container no migration is settling", "container", name)
		a.killRuncFor(name)
		_ = a.destroy(ctx, name)
	}
	if err := a.journal.Prune(512); err != nil {
		a.log.Warn("prune journal", "err", err)
	}
	return pending, nil
}

// recoverAll settles the interrupted migrations in the background, each
// with the machine its journal phase gives (migration.RecoverSource,
// migration.RecoverDest).
func (a *Agent) recoverAll(ctx context.Context, recs []journal.Record) {
	recs = a.settlePods(ctx, recs)
	for _, r := range recs {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer a.release(r.Container)
			a.log.Warn("settling a migration interrupted by a restart", "migration", r.ID, "role", r.Role,
				"container", r.Container, "phase", r.Phase)
			var outcome migration.Outcome
			if r.Role == migration.RoleSource {
				outcome = a.recoverSource(ctx, r)
			} else {
				outcome = a.recoverDest(ctx, r)
			}
			a.metrics.Recovered(string(outcome))
			a.log.Warn("interrupted migration settled", "migration", r.ID, "container", r.Container, "outcome", outcome)
		}()
	}
}

// settlePods keeps a pod whole on a destination that restarted while
// restoring it: its members are restored together (restoredSet.awaitAll)
// but journal it each on its own, so the agent may have died with some at
// Restored and others still at Transferred. A member whose restore ended
// (its container runs) is then settled as restored, as its pod's others
// are, rather than destroyed while they stay; and if one's restore did
// not end, the others, restored but not committed, are given up with it
// (their sources restore the whole pod). It returns recs with the phases
// to settle them from.
func (a *Agent) settlePods(ctx context.Context, recs []journal.Record) []journal.Record {
	restored := map[string]bool{}   // unit -> a pod member is Restored or later here
	unrestored := map[string]bool{} // unit -> a pod member's restore did not end
	pod := make([]bool, len(recs))
	running := make([]bool, len(recs))
	for i, r := range recs {
		if r.Role != migration.RoleDestination || r.Unit == "" || a.readMeta(r.Container).PodNet == "" {
			continue
		}
		pod[i] = true
		switch r.Phase {
		case migration.Restored, migration.Committed:
			restored[r.Unit] = true
		default:
			st, err := a.rt.State(ctx, r.Container)
			running[i] = r.Phase == migration.Transferred && err == nil && st.Status == runc.StatusRunning
			if !running[i] {
				unrestored[r.Unit] = true
			}
		}
	}
	for i, r := range recs {
		if !pod[i] {
			continue
		}
		switch {
		case unrestored[r.Unit] && r.Phase == migration.Restored:
			a.log.Warn("a pod member restored here is given up with another whose restore did not end", "container", r.Container, "unit", r.Unit)
			recs[i].Phase = migration.Transferred
		case !unrestored[r.Unit] && restored[r.Unit] && running[i]:
			a.log.Warn("a pod member restored with the others, not journaled yet, is settled as restored", "container", r.Container, "unit", r.Unit)
			recs[i].Phase = migration.Restored
		}
	}
	return recs
}

// recoverSource settles a migration this node was the source of.
func (a *Agent) recoverSource(ctx context.Context, rec journal.Record) migration.Outcome {
	a.mu.Lock()
	c := a.containers[rec.Container]
	a.mu.Unlock()
	if c == nil {
		// Its directory is gone: released after the commit, before the
		// journal said so.
		c = &container{meta: meta{Name: rec.Container}}
	}
	// The dead agent may have left its holds in the service's namespace:
	// without their queue, the kernel would drop every packet they take.
	// A frozen service's link goes down first: the packets its hold kept
	// from the frozen sockets must not reach them, nor the dumped tasks'
	// absence (a reset). Every way back to serving here brings it up.
	frozen := rec.Phase == migration.Frozen || rec.Phase == migration.Transferred
	if frozen {
		if err := a.plane.SetHostLink(c.meta.netOwner(), false); err != nil {
			a.log.Warn("take the frozen service's link down", "container", rec.Container, "err", err)
		}
	}
	if err := netplane.Unhold(a.nsPath(c.meta.netOwner())); err != nil {
		a.log.Warn("remove hold rules", "container", rec.Container, "err", err)
	}
	// Committed with a lazy dump: its page server served the destination
	// through the dead agent (the tunnel's splice, hybrid's proxy), so its
	// session broke and CRIU resumed the tasks with their sockets in
	// repair mode, unless every page had crossed and it ended them. Should
	// the destination hold no copy, the service resumes here: its sockets
	// must leave repair mode as after any failed lazy dump (the link stays
	// down until then), or it never answers again.
	lazyCommitted := rec.Phase == migration.Committed && rec.PageServer != ""
	if frozen || lazyCommitted {
		// A dump the dead agent started may still run (its runc outlives
		// it): a lazy one is made to fail, so CRIU resumes the service;
		// a full one is let finish. Either way the service is then
		// running (frozen) or gone with complete images.
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		if rec.PageServer != "" {
			go runc.AbortLazyDump(wctx, rec.PageServer)
		}
		if err := a.waitRuncGone(wctx, rec.Container); err != nil {
			a.log.Warn("an interrupted dump still runs", "container", rec.Container, "err", err)
		}
		cancel()
		if rec.PageServer != "" {
			a.endTCPRepair(rec.Container)
		}
	}
	handOver := false
	if frozen && !rec.Strategy.Lazy() {
		if p, ok := a.peers[rec.Peer]; ok {
			qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			ph, err := p.PeerPhase(qctx, rec.ID)
			cancel()
			handOver = err == nil && migration.Phase(ph.Phase) == migration.Restored
		}
	}
	if frozen && !rec.Strategy.Lazy() && rec.Unit != "" && a.journal.UnitCommitted(rec.Unit) {
		// Its group committed: every member had sent its state, and some
		// may serve on the destination already. This one commits too
		// (its destination restores it, asking our journal), or the
		// group would end split.
		a.log.Warn("its group had committed: committing", "container", rec.Container, "unit", rec.Unit)
		handOver = true
	}
	m, acts := migration.RecoverSource(rec.Strategy, rec.Phase, handOver)
	j := newJob(rec.ID, migration.RoleSource, rec.Container, a.cfg.Node, rec.Peer, rec.Strategy, nil)
	j.frozen = frozen
	a.jobs.add(j)
	o := &outgoing{a: a, job: j, m: m, rec: rec, c: c, req: migration.Request{To: rec.Peer, Strategy: rec.Strategy},
		tm: migration.NewTimer(nil), paused: true}
	o.res = migration.Result{ID: rec.ID, Container: rec.Container, From: a.cfg.Node, To: rec.Peer, Strategy: rec.Strategy,
		Started: rec.Updated, Recovered: true}
	if len(acts) == 0 {
		return m.Phase().Outcome()
	}
	o.loop(ctx, acts)
	snap, _, _ := j.snapshot(a.cfg.Node)
	return migration.Outcome(snap.State)
}

// recoverDest settles a migration this node was the destination of.
func (a *Agent) recoverDest(ctx context.Context, rec journal.Record) migration.Outcome {
	m := a.readMeta(rec.Container)
	d, acts := migration.RecoverDest(rec.Strategy, rec.Phase)
	j := newJob(rec.ID, migration.RoleDestination, rec.Container, rec.Peer, a.cfg.Node, rec.Strategy, nil)
	a.jobs.add(j)
	in := &incoming{a: a, job: j, m: d, rec: rec, c: &container{meta: m}, claimed: true,
		p: migration.Prepare{ID: rec.ID, Name: rec.Container, From: rec.Peer, Strategy: rec.Strategy}}
	if len(acts) == 0 {
		return d.Phase().Outcome()
	}
	in.loop(ctx, acts)
	snap, _, _ := j.snapshot(a.cfg.Node)
	return migration.Outcome(snap.State)
}

// incomingLeftovers lists containers whose recorded meta says a migration
// was bringing them here and never committed.
func (a *Agent) incomingLeftovers() []string {
	ents, _ := os.ReadDir(a.containersDir())
	var out []string
	for _, e := range ents {
		if m := a.readMeta(e.Name()); m.Incoming {
			out = append(out, m.Name)
		}
	}
	return out
}

// sweepScratch removes what migrations that ended left in the scratch
// directory (an agent killed after journaling one done, before removing
// its images): every entry but those of the containers whose migrations
// are being settled (active), which their settling removes.
func (a *Agent) sweepScratch(active map[string]bool) {
	ents, err := os.ReadDir(a.scratchDir())
	if err != nil {
		a.log.Warn("read scratch directory", "err", err)
		return
	}
	for _, e := range ents {
		if ofActive(e.Name(), active) {
			continue
		}
		dir := filepath.Join(a.scratchDir(), e.Name())
		err := errors.Join(linux.UnmountUnder(dir), os.RemoveAll(dir))
		if err != nil {
			a.log.Warn("remove scratch data no migration is settling", "entry", e.Name(), "err", err)
			continue
		}
		a.log.Info("removed scratch data no migration is settling", "entry", e.Name())
	}
}

// ofActive says whether scratch entry name (<container>-in, -out,
// -store…, or a stream's .<container>-in.partial-…) may belong to one of
// the active containers.
func ofActive(name string, active map[string]bool) bool {
	name = strings.TrimPrefix(name, ".")
	for c := range active {
		if strings.HasPrefix(name, c+"-") {
			return true
		}
	}
	return false
}

// runcProcs lists runc processes of this node working on container name.
func (a *Agent) runcProcs(name string) []int {
	pids, err := linux.FindProcesses(func(argv []string) bool {
		if len(argv) == 0 || filepath.Base(argv[0]) != "runc" {
			return false
		}
		root, id := false, false
		for i, s := range argv {
			if s == "--root" && i+1 < len(argv) && argv[i+1] == a.rt.Root {
				root = true
			}
			if s == name {
				id = true
			}
		}
		return root && id
	})
	if err != nil {
		a.log.Warn("list processes", "err", err)
	}
	return pids
}

// waitRuncGone waits until no runc process works on container name.
func (a *Agent) waitRuncGone(ctx context.Context, name string) error {
	for {
		pids := a.runcProcs(name)
		if len(pids) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("runc %v on %s: %w", pids, name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// killRuncFor kills the runc processes (and so their CRIU) left working on
// container name by an agent that died, and waits until they are gone.
func (a *Agent) killRuncFor(name string) {
	pids := a.runcProcs(name)
	if len(pids) == 0 {
		return
	}
	for _, pid := range pids {
		_ = linux.Kill(pid)
	}
	ctx, cancel := context.WithTimeout(a.runCtx, 10*time.Second)
	defer cancel()
	if err := a.waitRuncGone(ctx, name); err != nil {
		a.log.Warn("runc processes survive a kill", "container", name, "err", errors.Unwrap(err))
	}
}

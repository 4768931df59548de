package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/precopy"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/transfer"
	"github.com/edgehop/edgehop/internal/units"
)

// serveMigrations accepts incoming migrations and page tunnels until ctx
// ends. Only configured nodes get past the handshake's identity check.
func (a *Agent) serveMigrations(ctx context.Context, l *transfer.Listener) {
	for {
		conn, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			a.log.Warn("accept migration", "err", err)
			continue
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer conn.Close()
			if _, err := a.nodePeer(conn.Peer()); err != nil {
				a.log.Warn("migration connection refused", "from", conn.RemoteAddr(), "err", err)
				return
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			typ, body, err := conn.ReadMsg(rctx)
			cancel()
			if err != nil {
				a.log.Warn("migration connection", "from", conn.Peer(), "err", err)
				return
			}
			if isTunnel(typ) {
				if err := a.serveTunnel(ctx, conn, body); err != nil {
					a.log.Warn("page tunnel", "from", conn.Peer(), "err", err)
				}
				return
			}
			if err := a.receive(ctx, conn, typ, body); errors.Is(err, errBusy) {
				a.log.Info("incoming migration refused for now", "from", conn.Peer(), "reason", err)
			} else if err != nil {
				a.log.Warn("incoming migration failed", "from", conn.Peer(), "err", err)
			}
		}()
	}
}

// nodePeer returns the configured peer called name if it runs containers
// (a node, not the gateway).
func (a *Agent) nodePeer(name string) (Peer, error) {
	for _, p := range a.cfg.Peers {
		if p.Name == name && p.Migrate != "" {
			return p, nil
		}
	}
	return Peer{}, fmt.Errorf("%w: %q is not a configured node of this overlay", ErrForbidden, name)
}

// receive is the destination side of a migration: it validates the
// source's description and drives the migration.Dest machine.
func (a *Agent) receive(ctx context.Context, conn *transfer.Conn, typ string, body json.RawMessage) error {
	if typ != migration.MsgPrepare {
		return fmt.Errorf("protocol: got %q, want prepare", typ)
	}
	var p migration.Prepare
	refuse := func(err error) error {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		ab := migration.Abort{Reason: fmt.Sprintf("%s: %v", a.cfg.Node, err)}
		if errors.Is(err, errBusy) {
			ab.RetryAfterMs = int(busyRetry / time.Millisecond)
		}
		_ = conn.WriteMsg(wctx, migration.MsgAbort, ab)
		return err
	}
	if err := decodeStrict(body, &p); err != nil {
		return refuse(err)
	}
	if err := a.validatePrepare(p, conn.Peer()); err != nil {
		return refuse(err)
	}
	if a.cfg.Role != RoleNode {
		return refuse(fmt.Errorf("%s does not run containers", a.cfg.Node))
	}
	if _, err := a.journal.Get(p.ID); err == nil {
		return refuse(fmt.Errorf("%w: migration %s is already known here", ErrConflict, p.ID))
	}
	// A group's members share their unit's slot; the source waits and
	// asks again while there is none (errBusy).
	slot := cmp.Or(p.Unit, p.ID)
	if !a.admit.tryAcquire(slot) {
		return refuse(&busyError{reason: a.admit.capReason(a.cfg.Node)})
	}
	defer a.admit.release(slot)
	if err := a.checkScratchSpace(p); err != nil {
		return refuse(err)
	}
	defer a.admit.unreserve(p.ID)
	j := newJob(p.ID, migration.RoleDestination, p.Name, p.From, a.cfg.Node, p.Strategy, nil)
	in := &incoming{a: a, job: j, m: migration.NewDest(p.Strategy), conn: conn, p: p,
		rec: journal.Record{ID: p.ID, Role: migration.RoleDestination, Container: p.Name, Peer: p.From, Strategy: p.Strategy, Unit: p.Unit}}
	j.setQueued("") // admitted
	a.jobs.add(j)
	a.metrics.MigrationStarted(migration.RoleDestination)
	acts, err := in.m.Step(migration.Event{Kind: migration.EvStart})
	if err != nil {
		return refuse(err)
	}
	return in.loop(ctx, acts)
}

// incoming drives the destination side of one migration. Its fields
// belong to the goroutine running it.
type incoming struct {
	a    *Agent
	job  *job
	m    *migration.Dest
	rec  journal.Record
	conn *transfer.Conn // nil when a restarted agent settles the migration
	// frozen is the source's announcement of the freeze.
	frozen migration.FreezeNotice
	p      migration.Prepare

	c         *container
	lower     string
	claimed   bool
	unreserve func()
	holder    *netplane.Holder
	store     *precopy.Store
	imgDir    string
	cgroups   []runc.CgroupDir // the service's cgroups, which runc restores it in
	upper     string
	warm      *linux.Reserve
	sw        migration.Switched
	// taking is closed when the network switch started by takeTraffic,
	// which runs beside the state's reception, is done (nil: none
	// running); joinTake waits for it.
	taking      chan struct{}
	report      migration.RestoreReport
	stateBytes  int64
	recvMs      float64
	mountMs     float64
	pagesDaemon *runc.Daemon
	// commitRead is closed once the source's commit is in (journaled
	// here, or its record failed: the source's journal decides); until
	// then the page proxy keeps the lazy session from ending
	// (lazyproxy.PrefetchConfig.Release). nil: none to release.
	commitRead chan struct{}
	// pageDial reaches the source for the page tunnel (lazy strategies:
	// dialled as the freeze is announced, predialTunnel).
	pageDial func(context.Context) (*transfer.Conn, error)
	// gated is the restore started on the writable layer before the
	// images arrived (FreezeNotice.LayerFirst), waiting at its gate.
	gated *gatedRestore
	// liveLayer: what became of a restore started on a live layer
	// (migration.RestoreReport.LiveLayer).
	liveLayer string
	// next is the source's message after the state, read while the
	// restore runs (nil when nothing reads it yet).
	next    chan peerMessage
	t0      time.Time
	err     error
	cleanup []func()
}

// loop performs acts and feeds the machine the outcome until it finishes;
// it returns why the migration did not end well.
func (in *incoming) loop(ctx context.Context, acts []migration.Action) error {
	defer func() {
		in.joinTake()
		for i := len(in.cleanup) - 1; i >= 0; i-- {
			in.cleanup[i]()
		}
	}()
	for {
		ev, done := in.perform(ctx, acts)
		if done {
			return in.err
		}
		var err error
		if acts, err = in.m.Step(ev); err != nil {
			in.a.log.Error("migration machine", "migration", in.rec.ID, "err", err)
			if acts, _ = in.m.Step(migration.Event{Kind: migration.EvFailed, Err: err}); acts == nil {
				in.finish(migration.Action{Kind: migration.ActFinish, Outcome: migration.OutcomeLost, Err: err})
				return err
			}
		}
	}
}

func (in *incoming) perform(ctx context.Context, acts []migration.Action) (migration.Event, bool) {
	for _, act := range acts {
		in.job.update(func(p *api.Progress) { p.Phase, p.Step = string(in.m.Phase()), act.Kind.String() })
		if act.Kind != migration.ActReceive {
			// Only the state's reception runs beside the switch.
			in.joinTake()
		}
		switch act.Kind {
		case migration.ActJournal:
			err := in.journal(act.Phase)
			if act.Phase == migration.Committed {
				in.releaseLazySession()
			}
			if err != nil {
				if act.Phase.Final() || act.Phase == migration.Committed {
					// The source's journal decides a commit; a record that
					// did not reach the disk changes nothing about it.
					in.a.log.Error("journal", "migration", in.rec.ID, "phase", act.Phase, "err", err)
					continue
				}
				return migration.Event{Kind: migration.EvJournalFailed, Err: err}, false
			}
		case migration.ActAbortPeer:
			in.abortPeer(act.Err)
		case migration.ActTakeTraffic:
			in.takeTraffic(ctx)
		case migration.ActReleaseHeld:
			in.releaseHeld(ctx)
		case migration.ActAckCommit:
			in.ackCommit(ctx)
		case migration.ActFinish:
			in.finish(act)
			return migration.Event{}, true
		default:
			return in.do(ctx, act.Kind), false
		}
	}
	return migration.Event{Kind: migration.EvFailed, Err: errors.New("batch without an awaited action")}, false
}

func (in *incoming) journal(p migration.Phase) error {
	if p == migration.Restored && in.p.PodNet != "" && in.a.failpointArmed("pod-member-restored") {
		// A pod's members, restored together, journal it one at a time
		// when a crash test waits to land between two (settlePods).
		in.a.podJournal.Lock()
		defer in.a.podJournal.Unlock()
	}
	in.rec.Phase = p
	r, err := in.a.journal.Put(in.rec)
	in.rec = r
	if err == nil && p == migration.Restored && in.p.PodNet != "" {
		// The pod's other members are restored too, not journaled.
		in.a.failpoint("pod-member-restored")
	}
	return err
}

func (in *incoming) do(ctx context.Context, k migration.ActionKind) migration.Event {
	ev := func(ok migration.EventKind, err error) migration.Event {
		var pa *peerAbort
		switch {
		case err == nil:
			return migration.Event{Kind: ok}
		case errors.As(err, &pa):
			return migration.Event{Kind: migration.EvPeerAborted, Err: err}
		}
		return migration.Event{Kind: migration.EvFailed, Err: err}
	}
	switch k {
	case migration.ActSetupDest:
		return ev(migration.EvPrepared, in.setup(ctx))
	case migration.ActAckPrepared:
		return ev(migration.EvFrozen, in.awaitFreeze(ctx))
	case migration.ActReceive:
		return ev(migration.EvSent, in.receiveState(ctx))
	case migration.ActRestore:
		return ev(migration.EvRestored, in.restore(ctx))
	case migration.ActAwaitCommit:
		return ev(migration.EvCommit, in.awaitCommit(ctx))
	case migration.ActAwaitLazy:
		return ev(migration.EvLazyDone, in.awaitLazy(ctx))
	case migration.ActAskSource:
		return in.askSource(ctx)
	case migration.ActAskSourcePages:
		return in.askSourcePages(ctx)
	case migration.ActDestroy:
		return ev(migration.EvDestroyed, in.destroy(ctx))
	}
	return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("destination cannot perform %s", k)}
}

// setup prepares everything before the source freezes: rootfs base,
// namespace with the same IP and MAC, and the Holder, which keeps every
// packet for the service (in and out) away from it until the commit (so
// none meets a missing socket and draws a reset, and a copy that is rolled
// back never spoke). CRIU's own lock is skipped (runc.SkipNetworkLock).
func (in *incoming) setup(ctx context.Context) error {
	a, p := in.a, in.p
	if _, err := a.claim(p.Name, false); err != nil {
		return err
	}
	in.claimed = true
	in.cleanup = append(in.cleanup, func() { a.release(p.Name) })
	ip := netip.MustParseAddr(p.IP) // validated
	joined := p.PodNet != "" && p.PodNet != p.Name
	if !joined { // a pod's first member reserves the pod's address
		unreserve, err := a.reserveIP(ip, p.Name, p.From)
		if err != nil {
			return err
		}
		in.unreserve = unreserve
	}
	lower, digest, err := a.imageFor(ctx, p.Image, p.Digest)
	if err != nil {
		return err
	}
	if err := a.checkPrepareUser(p, lower); err != nil {
		return err
	}
	in.lower = lower
	m := meta{Name: p.Name, Image: p.Image, Digest: digest, IP: p.IP, MAC: p.MAC, Args: p.Args, Env: p.Env, Cwd: p.Cwd, Created: time.Now().UTC(), Incoming: true,
		Process: p.Process}
	in.c = &container{meta: m}
	if err := os.MkdirAll(a.dir(p.Name), 0o755); err != nil {
		return err
	}
	if p.Process.DevInLayer {
		ok, err := runc.DevicesAllowed(a.dir(p.Name))
		if err != nil {
			return fmt.Errorf("%s's /dev travels in its writable layer: %w", p.Name, err)
		}
		if !ok {
			return fmt.Errorf("%s's /dev travels in its writable layer, and %s here is mounted nodev: device nodes would not work", p.Name, a.cfg.StateDir)
		}
	}
	if err := a.writeMeta(m); err != nil {
		return err
	}
	if !joined {
		// (A pod's later members are restored into its first member's
		// namespace, made here by that member's migration, which holds
		// the pod's packets.)
		ns := a.nsPath(p.Name)
		if err := linux.NewNetNS(ns); err != nil {
			return err
		}
		ep := netplane.Endpoint{Container: p.Name, NetNSPath: ns, Addr: netip.PrefixFrom(ip, a.cfg.Overlay.Bits()), Gateway: a.cfg.Gateway}
		if err := a.plane.Attach(ep, false); err != nil {
			return err
		}
		hold := netplane.Hold
		if p.PodNet != "" {
			hold = netplane.HoldPod
		}
		if in.holder, err = hold(ns); err != nil {
			return err
		}
	}
	spec, err := a.runcSpec(m)
	if err != nil {
		return err
	}
	if err := runc.WriteBundle(a.bundle(p.Name), spec); err != nil {
		return err
	}
	if in.cgroups, err = a.restoreCgroups(p.Name); err != nil {
		return err
	}
	in.imgDir = filepath.Join(a.scratchDir(), p.Name+"-in")
	_ = os.RemoveAll(in.imgDir)
	in.cleanup = append(in.cleanup, func() {
		os.RemoveAll(in.imgDir)
		os.RemoveAll(in.workDir())
		os.RemoveAll(in.imgDir + "-images")
	})
	in.upper = filepath.Join(a.dir(p.Name), "upper")
	if p.Strategy.Live() {
		if in.store, err = precopy.NewStore(filepath.Join(a.scratchDir(), p.Name+"-store"), a.log); err != nil {
			return err
		}
		in.store.SetMaxBytes(stateLimit(p))
		in.cleanup = append(in.cleanup, func() { in.store.Close() })
	}
	return nil
}

// awaitFreeze tells the source this side is ready, then stores live rounds
// (pre-copy) until the source announces the freeze.
func (in *incoming) awaitFreeze(ctx context.Context) error {
	if err := in.conn.WriteMsg(ctx, migration.MsgPrepared, migration.ReadyNotice{GatedRestore: in.canGate()}); err != nil {
		return err
	}
	// Ready memory for the images and the restored process while the
	// source works; half is given back for the images when it freezes,
	// the rest just before the restore.
	if !in.p.Strategy.Lazy() {
		in.warm = reserveFor(context.WithoutCancel(ctx), 2*in.p.MemoryBytes)
		in.cleanup = append(in.cleanup, func() { in.warm.Close() })
	}
	var err error
	var live func(context.Context, migration.LiveLayer) error
	if in.canGate() {
		live = in.receiveLiveLayer
	}
	in.frozen, err = in.a.receiveRounds(ctx, in.conn, in.store, in.upper, live)
	switch {
	case err != nil:
	case in.frozen.LayerFirst && (!in.canGate() || in.store != nil || !in.frozen.LayerLive):
		err = fmt.Errorf("the source sends the writable layer first, which this side did not offer for %s", in.p.Strategy)
	case in.frozen.LayerLive != (in.gated != nil):
		err = fmt.Errorf("protocol: the freeze says a live layer came (%t), this side received one (%t)", in.frozen.LayerLive, in.gated != nil)
	}
	return err
}

// receiveLiveLayer receives, before the freeze (migration.MsgLiveLayer),
// the writable layer (pre-copy's came in the rounds) and runc's
// descriptors.json, and starts the restore on them (startGated): it
// waits at its gate for the images, and meanwhile only the layer's delta
// is to come (receiveLayerDelta).
func (in *incoming) receiveLiveLayer(ctx context.Context, ll migration.LiveLayer) error {
	if in.gated != nil {
		return errors.New("protocol: a second live layer")
	}
	if ll.Layer == (in.store != nil) {
		return fmt.Errorf("protocol: a live layer with the layer %t for %s", ll.Layer, in.p.Strategy)
	}
	var err error
	if ll.Layer {
		err = in.receiveLayerAndStart(ctx, stateLimit(in.p))
	} else {
		err = in.receiveDescriptorsAndStart(ctx)
	}
	if err != nil {
		return err
	}
	// Should the live layer change, the overlay is unmounted in the
	// frozen window, which syncs its upper file system: what is dirty
	// there now (an image unpacked for this migration) is written first.
	if err := syncFS(in.upper); err != nil {
		in.a.log.Warn("sync the writable layer's file system", "container", in.p.Name, "err", err)
	}
	g := in.gated
	if err := awaitGate(ctx, g.gate, g.done, func() error { return g.err }); err != nil {
		return fmt.Errorf("restore on the live layer: %w", err)
	}
	return in.conn.WriteMsg(ctx, migration.MsgLiveReady, struct{}{})
}

// receiveLayerDelta receives, in the frozen window, what changed in the
// writable layer since its live copy. When applying it would change
// nothing (layerMatch.unchanged: the service wrote nothing to its layer
// since), the restore started on the live copy goes on; when it only
// changes existing files, they are rewritten in place under the mounted
// root file system (layerMatch.applyInPlace) and the restore goes on too;
// otherwise the restore is called off, the root file system unmounted,
// the delta applied and the restore started again.
func (in *incoming) receiveLayerDelta(ctx context.Context, limit int64) error {
	rd, err := recvDelta(ctx, in.conn, in.upper, limit)
	defer rd.remove()
	if err != nil {
		return fmt.Errorf("receive writable layer delta: %w", err)
	}
	m, err := rd.match(in.upper)
	if err != nil {
		return fmt.Errorf("writable layer delta: %w", err)
	}
	why, err := m.unchanged()
	if err != nil {
		return fmt.Errorf("writable layer delta: %w", err)
	}
	if why == "" {
		in.liveLayer = "kept"
		return nil
	}
	a, name := in.a, in.p.Name
	if ok, err := m.applyInPlace(); err != nil {
		return fmt.Errorf("apply writable layer delta: %w", err)
	} else if ok {
		in.liveLayer = "rewritten"
		a.log.Info("the writable layer changed since its live copy: applied in place", "container", name, "change", why, "entries", rd.Changed)
		return nil
	}
	in.liveLayer = "restarted"
	t := time.Now()
	in.gated.stop(errors.New("the writable layer changed since its live copy"))
	// Unmounting an overlay syncs its upper file system: dirty data
	// there (the image just unpacked, other services' writes) was
	// flushed before the freeze (receiveLiveLayer).
	if err := linux.Unmount(a.rootfs(name)); err != nil {
		return fmt.Errorf("unmount the root file system: %w", err)
	}
	a.log.Info("the writable layer changed since its live copy: restore started again on the new one", "container", name, "change", why, "entries", rd.Changed, "stop_unmount", time.Since(t))
	if err := rd.apply(in.upper); err != nil {
		return fmt.Errorf("apply writable layer delta: %w", err)
	}
	// runc called off may have removed the cgroups it was to run in.
	if _, err := a.restoreCgroups(name); err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	return in.startGated(ctx, true)
}

// canGate says whether this side starts the restore before the images
// arrive (migration.ReadyNotice): only with the shim, which holds CRIU at
// the gate (without, runc itself would wait for the gate to open). A lazy
// strategy's pages then start to be served (startPages) once the images
// are here, just before the gate opens.
func (in *incoming) canGate() bool {
	return in.a.rt.Shim != ""
}

// takeTraffic points the overlay here; the packets are held. The switch
// takes a few round trips to the gateways and the source. When the
// source sends the writable layer first (FreezeNotice.LayerFirst), it
// runs while the state arrives (receiveState), so that the restore starts
// on the layer that many milliseconds sooner: any other action waits for
// it (joinTake). Otherwise the state comes after the dump, by which time
// the switch is done: the two do not compete for the CPU.
func (in *incoming) takeTraffic(ctx context.Context) {
	_, _ = in.warm.Release(in.p.MemoryBytes)
	if in.p.PodNet != "" && !in.frozen.PodNetwork {
		return // another member of the pod took the pod's traffic
	}
	if !in.frozen.LayerFirst {
		in.sw = in.a.takeTraffic(ctx, in.c, in.p.From, in.frozen.Accepting)
		return
	}
	done := make(chan struct{})
	in.taking = done
	go func() {
		defer close(done)
		in.sw = in.a.takeTraffic(ctx, in.c, in.p.From, in.frozen.Accepting)
	}()
}

// joinTake waits for the network switch takeTraffic started, if any.
func (in *incoming) joinTake() {
	if in.taking != nil {
		<-in.taking
		in.taking = nil
	}
}

// scratchHeadroom is the scratch space a migration needs beyond the
// service's memory: CRIU's other images, the transfer's partial files.
const scratchHeadroom = 32 << 20

// checkScratchSpace refuses, before anything is frozen, a migration whose
// images cannot fit in this node's scratch space: the service's memory
// (its pages arrive in images, or in the pre-copy store) plus headroom;
// post-copy's images hold no pages. It reserves that space, and the
// service's memory, until the migration ends (a.admit.unreserve): a
// migration that would fit but for what other incoming migrations
// reserved is refused for now (errBusy), and its source waits. The
// others' reservations are counted whole although part of them is
// already written (and so out of the free space): a conservative
// estimate, which costs a wait, never a failure. Members of one group
// reserve together: their sum must fit in the scratch space's size.
func (a *Agent) checkScratchSpace(p migration.Prepare) error {
	free, size := int64(-1), int64(-1)
	if st, err := linux.StatFileSystem(a.scratchDir()); err == nil {
		free, size = int64(st.Avail), int64(st.Size)
	}
	need := int64(scratchHeadroom)
	if !p.Strategy.Lazy() {
		need += p.MemoryBytes
	}
	avail := linux.AvailableMemory()
	r := reservation{unit: p.Unit, scratch: need, memory: p.MemoryBytes}
	return a.admit.reserve(p.ID, r, func(others, ownUnit reservation) error {
		if free < 0 { // unknown: the transfer's own bound decides
			return nil
		}
		if free < need {
			return fmt.Errorf("%w: no space for %s on %s: its scratch space has %s free, the migration needs about %s (%s of memory); raise the node's scratch_mb or use post-copy",
				ErrInvalid, p.Name, a.cfg.Node, units.FormatSize(free), units.FormatSize(need), units.FormatSize(p.MemoryBytes))
		}
		if p.Unit != "" && need+ownUnit.scratch > size {
			return fmt.Errorf("%w: no space for group %s on %s: its members need about %s of scratch space together, which has %s; raise the node's scratch_mb or use post-copy",
				ErrInvalid, p.Group, a.cfg.Node, units.FormatSize(need+ownUnit.scratch), units.FormatSize(size))
		}
		if free-others.scratch < need {
			return &busyError{reason: fmt.Sprintf("scratch space of %s reserved by other incoming migrations: %s free, %s of it reserved, %s needed",
				a.cfg.Node, units.FormatSize(free), units.FormatSize(others.scratch), units.FormatSize(need))}
		}
		if others.memory > 0 && avail > 0 && avail-others.memory < p.MemoryBytes {
			return &busyError{reason: fmt.Sprintf("memory of %s reserved by other incoming migrations: %s available, %s of it reserved, %s needed",
				a.cfg.Node, units.FormatSize(avail), units.FormatSize(others.memory), units.FormatSize(p.MemoryBytes))}
		}
		return nil
	})
}

// maxStateSlack is what the images may exceed the service's reported
// memory by: CRIU's metadata, page tables of a growing service, the
// writable layer's files.
const maxStateSlack = 512 << 20

// stateLimit bounds each stream of p's state this side receives (a
// pre-copy round, the final delta, the images, the layer's delta):
// twice the memory the source declared, plus maxStateSlack. The
// declared figure is the cgroup's anonymous memory (cgroupRSS); CRIU's
// images hold more than that: shared memory (SysV, memfd, shared
// anonymous mappings: pages-shmem images) is not in it, nor a page a
// forked worker still shares with its master, which CRIU dumps once per
// process (docs/measurements.md: WordPress's workers share none, other
// preforking servers may). Twice, not once, so a service with that much
// shared state is not refused; the bound still stops a peer that would
// fill the scratch space (checkScratchSpace weighed the declared figure).
func stateLimit(p migration.Prepare) int64 { return 2*p.MemoryBytes + maxStateSlack }

// sourceGaveUp returns the source's abort when err is one met where a
// stream was wanted (the source rolled back mid-transfer), err otherwise.
func (in *incoming) sourceGaveUp(err error) error {
	var mi *transfer.MsgInsteadError
	if !errors.As(err, &mi) {
		return err
	}
	var pa *peerAbort
	if errors.As(peerMessage{mi.Type, mi.Body, nil}.from(in.p.From, migration.MsgAbort, nil), &pa) {
		return pa
	}
	return err
}

// receiveState receives (or rebuilds) the images and the writable layer.
func (in *incoming) receiveState(ctx context.Context) error {
	defer in.joinTake()
	if in.p.Strategy.Lazy() {
		// The page tunnel's handshake, while the source dumps.
		var err error
		if in.pageDial, err = in.predialTunnel(ctx); err != nil {
			return err
		}
	}
	return in.sourceGaveUp(in.receiveStreams(ctx))
}

// receiveStreams is receiveState's work.
func (in *incoming) receiveStreams(ctx context.Context) error {
	t := time.Now()
	limit := stateLimit(in.p)
	if in.frozen.LayerFirst {
		err := in.receiveLayerFirst(ctx, limit)
		in.recvMs = migration.Ms(time.Since(t))
		return err
	}
	if in.store != nil && !in.p.Strategy.Lazy() {
		// A restore at its gate holds the image directory: the images
		// join it once complete.
		dir := in.imgDir
		if in.gated != nil {
			dir = in.imgDir + "-images"
		}
		fst, err := in.store.RebuildFinal(ctx, in.conn, dir)
		if err == nil && in.gated != nil {
			err = moveEntries(dir, in.imgDir)
		}
		if err != nil {
			return fmt.Errorf("rebuild images from pre-copy: %w", err)
		}
		in.stateBytes = fst.DumpBytes
	} else {
		dir := in.imgDir
		if in.gated != nil {
			dir = in.imgDir + "-images"
		}
		rst, err := in.conn.RecvDir(ctx, dir, transfer.RecvOptions{MaxBytes: limit})
		if err == nil && in.gated != nil {
			err = moveEntries(dir, in.imgDir)
		}
		if err != nil {
			return fmt.Errorf("receive images: %w", err)
		}
		in.stateBytes = rst.PayloadBytes
	}
	if in.store != nil && in.gated != nil {
		// The restore at its gate holds the layer mounted.
		if err := in.receiveLayerDelta(ctx, limit); err != nil {
			return err
		}
	} else if in.store != nil {
		if err := recvLayerDelta(ctx, in.conn, in.upper, limit); err != nil {
			return fmt.Errorf("receive writable layer delta: %w", err)
		}
	} else if _, err := in.conn.RecvDir(ctx, in.upper, transfer.RecvOptions{MaxBytes: limit}); err != nil {
		return fmt.Errorf("receive writable layer: %w", err)
	}
	in.recvMs = migration.Ms(time.Since(t))
	return nil
}

// receiveLayerFirst receives the state of stop-and-copy and post-copy in
// the frozen window: the writable layer's delta since its live copy,
// which the source sends while CRIU dumps (receiveLayerDelta: the restore
// started on the live layer goes on or starts again), then the images:
// when the last image is here, runc is at its gate and only CRIU (and
// post-copy's page service) is left to start.
func (in *incoming) receiveLayerFirst(ctx context.Context, limit int64) error {
	if err := in.receiveLayerDelta(ctx, limit); err != nil {
		return err
	}
	images := in.imgDir + "-images"
	rst, err := in.conn.RecvDir(ctx, images, transfer.RecvOptions{MaxBytes: limit})
	if err == nil {
		err = moveEntries(images, in.imgDir)
	}
	if err != nil {
		in.gated.stop(err)
		return fmt.Errorf("receive images: %w", err)
	}
	in.stateBytes = rst.PayloadBytes
	return nil
}

// syncFS writes the dirty data of the file system holding path.
func syncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return linux.Syncfs(f)
}

// receiveLayerAndStart receives the writable layer and runc's
// descriptors.json and starts the restore on them, held at its gate
// (startGated).
func (in *incoming) receiveLayerAndStart(ctx context.Context, limit int64) error {
	if _, err := in.conn.RecvDir(ctx, in.upper, transfer.RecvOptions{MaxBytes: limit}); err != nil {
		return fmt.Errorf("receive writable layer: %w", err)
	}
	return in.receiveDescriptorsAndStart(ctx)
}

// receiveDescriptorsAndStart receives runc's descriptors.json and starts
// the restore on the writable layer here, held at its gate (startGated).
func (in *incoming) receiveDescriptorsAndStart(ctx context.Context) error {
	if err := os.Mkdir(in.imgDir, 0o700); err != nil {
		return err
	}
	if _, err := in.conn.RecvFile(ctx, filepath.Join(in.imgDir, runc.DescriptorsFile), transfer.RecvOptions{MaxBytes: maxDescriptors}); err != nil {
		return fmt.Errorf("receive runc's descriptors: %w", err)
	}
	return in.startGated(ctx, false)
}

// maxDescriptors bounds runc's descriptors.json (the container's stdio
// as three short strings, and a few more for inherited descriptors).
const maxDescriptors = 64 << 10

// moveEntries moves every entry of dir src into dir dst, replacing those
// of the same name, and removes src: runc holds dst open, so it must stay
// the same directory.
func moveEntries(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return os.Remove(src)
}

// gatedRestore is a restore started before the images arrived, held at
// its gate (runc.RestoreOpts.Gate) until they have.
type gatedRestore struct {
	gate    *runc.Gate
	lf      *os.File // the service's output, handed to it once restored
	cancel  context.CancelCauseFunc
	resumed chan struct{} // closed when CRIU resumed the restored tasks
	once    sync.Once
	done    chan struct{} // closed with err set, once runc exited
	err     error
}

// markResumed is the restore's runc.RestoreOpts.Resumed.
func (g *gatedRestore) markResumed() { g.once.Do(func() { close(g.resumed) }) }

// stop calls the restore off (at its gate: runc then removes what it
// made) and waits for runc. A restore whose tasks CRIU resumed is not
// called off: runc finishes (runcExitWait), and a runc killed then
// would leave the container as it is anyway.
func (g *gatedRestore) stop(cause error) {
	select {
	case <-g.resumed:
		select {
		case <-g.done:
			return
		case <-time.After(runcExitWait):
		}
	default:
	}
	g.cancel(cause)
	<-g.done
}

// runcExitWait bounds how long a restore's runc may take to exit once
// CRIU resumed the tasks (it answers CRIU's last notification, waits for
// CRIU to exit and exits: a few ms).
const runcExitWait = 10 * time.Second

// open lets CRIU in and returns once CRIU has resumed the restored tasks
// (runc still finishing; stop waits for it), or with the restore's
// failure; when ctx ends first, runc is killed.
func (g *gatedRestore) open(ctx context.Context) error {
	g.gate.Open()
	select {
	case <-g.resumed:
		return nil
	case <-g.done:
	case <-ctx.Done():
		g.stop(context.Cause(ctx))
	}
	return g.err
}

// startGated mounts the root file system on the received layer and starts
// `runc restore`, which waits at its gate for restore to open it; urgent:
// in the frozen window, runc runs at full priority until then.
func (in *incoming) startGated(ctx context.Context, urgent bool) error {
	a, p := in.a, in.p
	lf, err := in.mountRootfs()
	if err != nil {
		return err
	}
	gctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	g := &gatedRestore{gate: runc.NewGate(), lf: lf, cancel: cancel, resumed: make(chan struct{}), done: make(chan struct{})}
	in.gated = g
	// Whatever ends the migration, runc is done before the cleanup, and
	// the output file is closed unless the restored service has it.
	in.cleanup = append(in.cleanup, func() {
		g.stop(errors.New("migration ended"))
		a.mu.Lock()
		handed := in.c.log == lf
		a.mu.Unlock()
		if !handed {
			lf.Close()
		}
	})
	go func() {
		defer close(g.done)
		o := in.restoreOpts()
		o.Gate, o.Urgent, o.Resumed = g.gate, urgent, g.markResumed
		o.LazyPages = p.Strategy.Lazy()
		_, g.err = a.rt.Restore(gctx, p.Name, a.bundle(p.Name), o, runc.IO{Stdout: lf, Stderr: lf})
		if g.err != nil && isClosed(g.resumed) {
			a.log.Error("restored service gone after CRIU resumed it: runc failed and the container does not run", "container", p.Name, "err", g.err)
		}
	}()
	return nil
}

// restore mounts the root filesystem and restores the service; its
// packets stay held.
func (in *incoming) restore(ctx context.Context) error {
	a, p := in.a, in.p
	if err := in.checkImageCreds(); err != nil {
		if in.gated != nil {
			in.gated.stop(err)
		}
		return err
	}
	var lf *os.File
	var run func(ctx context.Context) error
	if in.gated != nil {
		// runc waits at its gate on the root file system mounted and
		// the images all here.
		if p.Strategy.Lazy() {
			if err := in.startPages(ctx); err != nil {
				in.gated.stop(err)
				return err
			}
		}
		lf, run = in.gated.lf, in.gated.open
	} else {
		var err error
		if lf, err = in.prepareRestore(ctx); err != nil {
			return err
		}
		run = func(ctx context.Context) error {
			o := in.restoreOpts()
			o.LazyPages = p.Strategy.Lazy()
			_, err := a.rt.Restore(ctx, p.Name, a.bundle(p.Name), o, runc.IO{Stdout: lf, Stderr: lf})
			return err
		}
	}
	_, _ = in.warm.Release(-1)
	in.t0 = time.Now()
	// A restore that hangs must not keep the service away for good: past
	// the deadline it is killed and the source takes the service back.
	rdl := migration.RestoreDeadline(in.stateBytes)
	sctx, scancel := context.WithCancelCause(ctx)
	rctx, rcancel := context.WithTimeout(sctx, rdl)
	in.watchSource(ctx, scancel)
	err := run(rctx)
	var pa *peerAbort
	switch {
	case err == nil:
	case errors.As(context.Cause(sctx), &pa):
		err = fmt.Errorf("restore stopped: %w", pa)
	case rctx.Err() == context.DeadlineExceeded:
		err = fmt.Errorf("no restore within %s (%d bytes of images): %w", rdl, in.stateBytes, err)
	}
	rcancel()
	scancel(nil)
	if err != nil {
		lf.Close()
		return fmt.Errorf("restore: %w", err)
	}
	in.c.log = lf
	if p.Unit != "" {
		a.restored.mark(p.Unit, p.Name)
	}
	if p.PodNet != "" {
		// A pod is restored whole here or not at all: its members share
		// one namespace, which cannot be in two places.
		t := time.Now()
		if err := a.restored.awaitAll(ctx, p.Unit, p.Members, podRestoreWait); err != nil {
			in.c.log = nil
			lf.Close()
			return fmt.Errorf("pod %s: %w", p.Group, err)
		}
		a.log.Info("pod restored whole", "container", p.Name, "pod", p.Group, "waited", time.Since(t))
	}
	return nil
}

// prepareRestore mounts the root file system and, for post-copy, starts
// what serves the pages (startPages); it returns the service's output
// file.
func (in *incoming) prepareRestore(ctx context.Context) (*os.File, error) {
	lf, err := in.mountRootfs()
	if err != nil {
		return nil, err
	}
	if in.p.Strategy.Lazy() {
		if err := in.startPages(ctx); err != nil {
			lf.Close()
			return nil, err
		}
	}
	return lf, nil
}

// startPages starts what serves a lazy restore its pages, on the images
// here: the tunnel to the source, the proxy, the lazy-pages daemon.
func (in *incoming) startPages(ctx context.Context) error {
	a, p := in.a, in.p
	// Pages come from the source's page server through an
	// authenticated tunnel; the daemon outlives the restore.
	dial := in.pageDial
	if dial == nil {
		var err error
		if dial, err = a.tunnelDialer(p.From); err != nil {
			return err
		}
	}
	tctx, tcancel := context.WithCancel(context.WithoutCancel(ctx))
	in.cleanup = append(in.cleanup, tcancel)
	tun, err := transfer.TunnelListen(tctx, "127.0.0.1:0", transfer.TunnelRequest{Target: p.PageServer, Token: p.PageToken}, dial)
	if err != nil {
		return fmt.Errorf("page tunnel: %w", err)
	}
	in.cleanup = append(in.cleanup, func() { tun.Close() })
	// A proxy in front of the daemon pulls the dump's lazy runs ahead
	// of it (hybrid: and fills the pages the rounds left here from
	// the store); without the runs, hybrid's proxy relays only.
	runs, rerr := precopy.LazyRuns(in.imgDir)
	if rerr != nil {
		a.log.Warn("lazy pages: no prefetch (lazy runs unreadable)", "container", p.Name, "err", rerr)
	}
	if in.store == nil && rerr != nil {
		// Without the proxy nothing would hold the session's end until
		// the commit (below); CRIU's restore reads the same pagemaps.
		return fmt.Errorf("lazy pages: the dump's lazy runs: %w", rerr)
	}
	// The session with the source's page server ends only after the
	// commit: its end makes CRIU kill the source's dumped tasks, which
	// a rollback before the commit resumes.
	in.commitRead = make(chan struct{})
	pageServer, err := a.serveLazyPages(tctx, p.Name, tun.Addr().String(), in.store, runs, p.MemoryBytes, in.commitRead)
	if err != nil {
		return fmt.Errorf("page proxy: %w", err)
	}
	if in.pagesDaemon, err = a.rt.StartLazyPages(tctx, runc.LazyPagesOpts{ImagePath: in.imgDir, WorkPath: in.workDir(), PageServer: pageServer}); err != nil {
		return fmt.Errorf("lazy-pages daemon: %w", err)
	}
	in.cleanup = append(in.cleanup, in.pagesDaemon.Stop)
	return nil
}

// releaseLazySession lets the lazy session end (commitRead): the source
// has committed.
func (in *incoming) releaseLazySession() {
	if in.commitRead != nil {
		close(in.commitRead)
		in.commitRead = nil
	}
}

// mountRootfs mounts the root file system on the received layer and
// opens the service's output file.
func (in *incoming) mountRootfs() (*os.File, error) {
	a, name := in.a, in.p.Name
	t := time.Now()
	if err := linux.MountOverlay(in.lower, in.upper, filepath.Join(a.dir(name), "work"), a.rootfs(name)); err != nil {
		return nil, err
	}
	in.mountMs = migration.Ms(time.Since(t))
	return a.openLog(name)
}

// restoreOpts are the options of every restore here: the images
// received, TCP connections and file locks kept.
func (in *incoming) restoreOpts() runc.RestoreOpts {
	return runc.RestoreOpts{ImagePath: in.imgDir, WorkPath: in.workDir(), TCPEstablished: true, FileLocks: true, Cgroups: in.cgroups}
}

// workDir is where CRIU's restore writes its logs and statistics.
func (in *incoming) workDir() string { return in.imgDir + "-work" }

// podRestoreWait bounds how long a restored pod member waits for the
// others (whose state may still be arriving) before it gives up.
const podRestoreWait = 10 * time.Minute

// watchSource reads the source's next message while the restore runs: a
// source that rolls back meanwhile (a group's other member failed) says
// so, and stop is called with its reason, so that a restore waiting for
// pages its page server will never send ends now, not at its deadline.
// Anything else (the commit, a broken connection) is left to awaitCommit.
func (in *incoming) watchSource(ctx context.Context, stop context.CancelCauseFunc) {
	if in.conn == nil {
		return
	}
	in.next = make(chan peerMessage, 1)
	go func() {
		// Ends with the connection, which the receiving goroutine closes.
		typ, body, err := in.conn.ReadMsg(context.WithoutCancel(ctx))
		m := peerMessage{typ, body, err}
		var pa *peerAbort
		if errors.As(m.from(in.p.From, migration.MsgCommit, nil), &pa) {
			stop(pa)
		}
		in.next <- m
	}()
}

// awaitCommit waits for the source's commit, which follows the state
// and so is normally here already.
func (in *incoming) awaitCommit(ctx context.Context) error {
	in.report = migration.RestoreReport{RestoreMs: migration.Ms(time.Since(in.t0)), NetworkMs: in.sw.NetworkMs,
		RecvMs: in.recvMs, MountMs: in.mountMs, LiveLayer: in.liveLayer}
	if in.next == nil {
		return expectFrom(ctx, in.conn, in.p.From, migration.MsgCommit, nil)
	}
	select {
	case m := <-in.next:
		return m.from(in.p.From, migration.MsgCommit, nil)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// releaseHeld makes the committed service this node's own: recorded, then
// its held packets delivered.
func (in *incoming) releaseHeld(ctx context.Context) {
	a := in.a
	if p := in.p; p.Unit != "" && len(p.After) > 0 {
		// A group's member serves only once the members it depends on
		// are restored here (their packets stay held meanwhile).
		t := time.Now()
		if missing := a.restored.await(ctx, p.Unit, p.Members, p.After, unitDepsWait); len(missing) > 0 {
			a.log.Warn("serving before the members it depends on were restored (their migrations failed?)", "container", p.Name, "missing", missing)
		} else if w := time.Since(t); w > time.Millisecond {
			a.log.Info("waited for the members it depends on", "container", p.Name, "after", p.After, "waited", w)
		}
	}
	if in.holder != nil {
		held, err := in.holder.Release()
		if err != nil {
			a.log.Warn("release held packets", "container", in.c.meta.Name, "err", err)
		}
		in.sw.Held = held
		h := in.holder
		in.holder = nil
		// The rules go after the answer: they do not delay the service,
		// and packets pass meanwhile.
		in.cleanup = append(in.cleanup, func() {
			if err := h.Close(); err != nil {
				a.log.Warn("stop holding", "container", in.c.meta.Name, "err", err)
			}
		})
	} else if !in.c.meta.joined() {
		// Settled after a restart: the holder died with the agent and
		// left its rules, which drop the service's packets until removed.
		if err := netplane.Unhold(a.nsPath(in.c.meta.Name)); err != nil {
			a.log.Warn("remove hold rules", "container", in.c.meta.Name, "err", err)
		}
		in.sw = a.takeTraffic(ctx, in.c, in.p.From, false)
	}
	in.c.meta.Incoming = false
	a.adopt(in.c)
	if in.unreserve != nil {
		in.unreserve()
		in.unreserve = nil
	}
}

func (in *incoming) ackCommit(ctx context.Context) {
	if in.conn == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sw := in.sw
	sw.Restore = in.report
	if st, err := runc.ReadRestoreStats(in.workDir()); err == nil {
		sw.Restore.CRIU = restoreStatsMap(st)
	}
	_ = in.conn.WriteMsg(wctx, migration.MsgSwitched, sw)
}

// awaitLazy keeps the images and the tunnel until every page has arrived.
func (in *incoming) awaitLazy(ctx context.Context) error {
	if in.pagesDaemon == nil {
		return nil
	}
	if err := in.pagesDaemon.Wait(context.WithoutCancel(ctx)); err != nil {
		in.a.log.Error("post-copy: pages not all received", "container", in.p.Name, "err", err)
		return fmt.Errorf("post-copy pages not all received: %w", err)
	}
	in.a.log.Info("post-copy: all pages received", "container", in.p.Name, "after_ms", migration.Ms(time.Since(in.t0)))
	return nil
}

// askSource learns the source's decision from its journal, asking until
// it gives one: the restored copy stays, its packets held, meanwhile.
func (in *incoming) askSource(ctx context.Context) migration.Event {
	src, err := in.sourcePeer()
	if err != nil {
		return migration.Event{Kind: migration.EvFailed, Err: err}
	}
	return in.pollSource(ctx, src, "restored copy waits for the source's decision", 2*time.Second, func(ph api.PeerPhase) (migration.Event, bool) {
		switch migration.Phase(ph.Phase) {
		case migration.Committed, migration.Done, migration.Lost:
			// Lost: the source's rollback failed, so this copy is
			// the only one; it serves.
			return migration.Event{Kind: migration.EvPeerCommitted}, true
		case migration.RolledBack, migration.Aborted:
			return migration.Event{Kind: migration.EvPeerGaveUp}, true
		}
		return migration.Event{}, false
	})
}

// askSourcePages settles a committed lazy copy whose lazy-pages daemon and
// proxy died with the agent (migration.ActAskSourcePages): the pages not
// yet here are lost to it, and a task faulting one of them once the
// daemon's userfaultfd is closed reads zeros. The copy is frozen
// meanwhile, so it serves nobody from such memory. The source decides:
// its journal done (it served every page, its CRIU ended the session
// with success): the copy is whole and thawed; its dump failed and CRIU
// resumed the tasks there (PeerPhase.Holds), or it rolled back: the copy
// goes, and the source takes the service back once it reads that.
func (in *incoming) askSourcePages(ctx context.Context) migration.Event {
	a, name := in.a, in.rec.Container
	src, err := in.sourcePeer()
	if err != nil {
		return migration.Event{Kind: migration.EvFailed, Err: err}
	}
	if err := linux.FreezeCgroup(ctx, a.cgroupsPath(name)); err != nil {
		a.log.Warn("freeze a copy whose lazy pages were cut off", "container", name, "err", err)
	}
	return in.pollSource(ctx, src, "a copy whose lazy pages were cut off waits for the source's word", time.Second, func(ph api.PeerPhase) (migration.Event, bool) {
		switch p := migration.Phase(ph.Phase); {
		case p == migration.Done || p == migration.Lost:
			// Lost: no copy but this one is left.
			if err := linux.ThawCgroup(ctx, a.cgroupsPath(name)); err != nil {
				return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("thaw %s: %w", name, err)}, true
			}
			return migration.Event{Kind: migration.EvPeerCommitted}, true
		case p == migration.Committed && ph.Holds, p == migration.RolledBack, p == migration.Aborted:
			return migration.Event{Kind: migration.EvPeerGaveUp}, true
		}
		return migration.Event{}, false
	})
}

// sourcePeer is the client of the migration's source.
func (in *incoming) sourcePeer() (*api.Client, error) {
	src, ok := in.a.peers[in.rec.Peer]
	if !ok {
		return nil, fmt.Errorf("source %q is not a configured peer", in.rec.Peer)
	}
	return src, nil
}

// pollSource asks the source's journal for this migration's phase until
// decide settles on an event, backing off from 100 ms to maxWait between
// asks and logging waiting every 50. A source that has no record of it
// gave up.
func (in *incoming) pollSource(ctx context.Context, src *api.Client, waiting string, maxWait time.Duration, decide func(api.PeerPhase) (migration.Event, bool)) migration.Event {
	a := in.a
	wait := 100 * time.Millisecond
	for n := 0; ; n++ {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ph, err := src.PeerPhase(rctx, in.rec.ID)
		cancel()
		switch {
		case errors.Is(err, api.ErrNotFound):
			return migration.Event{Kind: migration.EvPeerGaveUp}
		case err == nil:
			if ev, ok := decide(ph); ok {
				return ev
			}
		}
		if n%50 == 0 {
			a.log.Warn(waiting, "container", in.rec.Container, "source", in.rec.Peer, "phase", ph.Phase, "err", err)
		}
		select {
		case <-ctx.Done():
			return migration.Event{Kind: migration.EvFailed, Err: ctx.Err()}
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}

// destroy removes the copy and everything prepared for it.
func (in *incoming) destroy(ctx context.Context) error {
	a, name := in.a, in.rec.Container
	if !in.claimed && in.conn != nil {
		// Refused before anything was set up here: nothing to remove,
		// and another container may own the name.
		return nil
	}
	if in.p.Unit != "" {
		a.restored.markFailed(in.p.Unit, name)
	}
	a.killRuncFor(name)
	err := a.destroy(context.WithoutCancel(ctx), name)
	if in.holder != nil {
		// Only now that the namespace is gone: the source may have
		// resumed and be sending to the service again, and packets still
		// routed here must be dropped (TCP resends them there), not meet
		// an address without its sockets and draw a reset.
		_ = in.holder.Drop()
		in.holder = nil
	}
	// (precopy.PagesDir: a final delta's pages before the other images.)
	// (-in-images: the images of a gated restore, before they join -in.)
	dirs := []string{name + "-in", name + "-in-work", name + "-in-images", name + "-store", filepath.Base(precopy.PagesDir(name + "-in")),
		filepath.Base(precopy.PagesDir(name + "-in-images"))}
	// A stream cut short leaves its partial directory (transfer.RecvDir).
	for _, d := range []string{name + "-in", name + "-in-images"} {
		partial, _ := filepath.Glob(filepath.Join(a.scratchDir(), "."+d+".partial-*"))
		for _, p := range partial {
			dirs = append(dirs, filepath.Base(p))
		}
	}
	for _, d := range dirs {
		// A CRIU restore killed midway leaves its cgroup yard mounted
		// in its work directory.
		dir := filepath.Join(a.scratchDir(), d)
		if rerr := linux.UnmountUnder(dir); rerr != nil {
			err = errors.Join(err, rerr)
		}
		if rerr := os.RemoveAll(dir); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	if in.unreserve != nil {
		in.unreserve()
		in.unreserve = nil
	}
	return err
}

func (in *incoming) abortPeer(cause error) {
	in.err = cause
	if in.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(in.a.runCtx, 2*time.Second)
	defer cancel()
	_ = in.conn.WriteMsg(ctx, migration.MsgAbort, migration.Abort{Reason: fmt.Sprintf("%s: %v", in.a.cfg.Node, cause)})
}

func (in *incoming) finish(act migration.Action) {
	if act.Err != nil && in.err == nil {
		in.err = act.Err
	}
	res := migration.Result{ID: in.rec.ID, Container: in.rec.Container, From: in.rec.Peer, To: in.a.cfg.Node,
		Strategy: in.rec.Strategy, Outcome: act.Outcome, OK: act.Outcome == migration.OutcomeOK, HeldPackets: in.sw.Held}
	if in.err != nil {
		res.Error = in.err.Error()
	}
	in.a.metrics.ObserveResult(res, migration.RoleDestination)
	in.job.end(act.Outcome, &res)
}

// takeTraffic points the overlay at this node for the service: the local
// bridge entry, then every peer's FDB in parallel. It runs while the source
// dumps; until the commit, the packets are held (netplane.Holder).
func (a *Agent) takeTraffic(ctx context.Context, c *container, from string, gatewaysFirst bool) migration.Switched {
	t0 := time.Now()
	a.pinHere(c, t0)
	// The gateways (where clients' traffic enters the overlay) and the
	// source are told before the state is taken; the other nodes (their
	// services' traffic to this one) in the background, so that a node
	// that stopped answering never lengthens the frozen window.
	// gatewaysFirst (the source waits for its word before it takes the
	// service's link down): the gateways, then the source.
	gateway := func(p Peer) bool { return p.Migrate == "" }
	source := func(p Peer) bool { return p.Name == from }
	critical := func(p Peer) bool { return gateway(p) || source(p) }
	order := []func(Peer) bool{critical}
	if gatewaysFirst {
		order = []func(Peer) bool{gateway, source}
	}
	for _, which := range order {
		if err := a.announceTo(ctx, a.endpoint(c), which); err != nil {
			a.log.Warn("announce migrated endpoint", "container", c.meta.Name, "err", err)
		}
	}
	ep := a.endpoint(c)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.announceTo(a.runCtx, ep, func(p Peer) bool { return !critical(p) }); err != nil {
			a.log.Warn("announce migrated endpoint to the other nodes", "container", ep.Name, "err", err)
		}
	}()
	return migration.Switched{NetworkMs: migration.Ms(time.Since(t0))}
}

// pinHere points this node's bridge at the service's local link (its
// pod's, for a pod member) for good: its overlay MAC's remote entry goes,
// a sticky local one comes, stamped at so that an older announcement
// from a peer does not undo it.
func (a *Agent) pinHere(c *container, at time.Time) {
	mac, _ := net.ParseMAC(c.meta.MAC)
	a.fdb.stamp(mac.String(), at)
	if err := a.plane.DelRemote(mac); err != nil {
		a.log.Warn("drop remote fdb", "container", c.meta.Name, "err", err)
	}
	if err := a.plane.PinLocal(mac, c.meta.netOwner()); err != nil {
		a.log.Warn("pin local fdb", "container", c.meta.Name, "err", err)
	}
}

// adopt records a committed incoming container as this node's own. A
// failed write is logged: the journal's Done, written after, is what a
// restart reads (pendingRecoveries adopts it then).
func (a *Agent) adopt(c *container) {
	c.meta.Incoming = false
	if err := a.writeMeta(c.meta); err != nil {
		a.log.Error("record committed container (a restart adopts it from the journal)", "container", c.meta.Name, "err", err)
	}
	a.mu.Lock()
	a.containers[c.meta.Name] = c
	a.mu.Unlock()
}

// isClosed says whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

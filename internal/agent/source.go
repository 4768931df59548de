package agent

import (
	"bytes"
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
	"github.com/edgehop/edgehop/internal/blockdiff"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/lazyproxy"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/precopy"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/transfer"
)

// scratchDir is tmpfs-backed space for checkpoint images (mounted by Run).
func (a *Agent) scratchDir() string { return filepath.Join(a.cfg.StateDir, "scratch") }

func (a *Agent) peer(name string) (Peer, error) {
	for _, p := range a.cfg.Peers {
		if p.Name == name {
			if p.Migrate == "" {
				return p, fmt.Errorf("%w: %s is not a node that runs containers", ErrInvalid, name)
			}
			return p, nil
		}
	}
	return Peer{}, fmt.Errorf("%w: unknown destination node %q", ErrInvalid, name)
}

// StartMigration checks a migration request and starts it as a job of
// this agent; the service keeps running untouched when it is refused.
func (a *Agent) StartMigration(name string, req migration.Request) (*job, error) {
	if err := checkRequest(a.cfg.Node, req); err != nil {
		return nil, err
	}
	a.mu.Lock()
	var pod string
	if c := a.containers[name]; c != nil && c.meta.PodNet != "" {
		pod = c.meta.Group
	}
	a.mu.Unlock()
	if pod != "" {
		return nil, fmt.Errorf("%w: %s is a member of pod %s, whose members share one network and move together: migrate the pod ('edgehop migrate %s --to %s')", ErrInvalid, name, pod, pod, req.To)
	}
	o, err := a.newOutgoing(name, req)
	if err != nil {
		return nil, err
	}
	return a.runOutgoing(o), nil
}

// checkRequest checks what a migration request asks for itself.
func checkRequest(node string, req migration.Request) error {
	if req.To == node {
		return fmt.Errorf("%w: the destination %s is this node", ErrInvalid, req.To)
	}
	switch req.Strategy {
	case migration.StopAndCopy, migration.PostCopy, migration.PreCopy, migration.Hybrid:
	default:
		return fmt.Errorf("%w: strategy %q is not available on the agent (stop-and-copy, post-copy, pre-copy, hybrid; auto is resolved by the CLI)", ErrInvalid, req.Strategy)
	}
	if req.Rounds < 0 {
		return fmt.Errorf("%w: rounds %d < 0", ErrInvalid, req.Rounds)
	}
	if req.MaxFrozenMs < 0 {
		return fmt.Errorf("%w: max frozen %d ms < 0", ErrInvalid, req.MaxFrozenMs)
	}
	return nil
}

// newOutgoing claims container name for a migration by req (checked by
// checkRequest) and readies its driver; runOutgoing starts it.
func (a *Agent) newOutgoing(name string, req migration.Request) (*outgoing, error) {
	comp := transfer.CompressAuto
	if req.Compression != "" {
		var err error
		if comp, err = transfer.ParseCompression(req.Compression); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	peer, err := a.peer(req.To)
	if err != nil {
		return nil, err
	}
	ctx := a.runCtx
	c, err := a.claimWhenFree(ctx, name, 5*time.Second)
	if err != nil {
		return nil, err
	}
	st, err := a.rt.State(ctx, name)
	if err != nil || st.Status != runc.StatusRunning {
		a.release(name)
		status := string(st.Status)
		if err != nil {
			status = "gone"
		}
		return nil, fmt.Errorf("%w: %s is not running on %s (status %s), so there is nothing to migrate; see 'edgehop logs %s'", ErrInvalid, name, a.cfg.Node, status, name)
	}
	dumpAs, err := a.checkDumpable(ctx, name, st.Pid)
	if err != nil {
		a.release(name)
		return nil, err
	}
	id := journal.NewID()
	return &outgoing{a: a, m: migration.NewSource(req.Strategy), req: req, c: c, peer: peer, dumpAs: dumpAs, pid: st.Pid,
		send: transfer.SendOptions{Compression: comp, LinkBitsPerSecond: max(req.LinkBps, 0)}, comp: comp,
		rec: journal.Record{ID: id, Role: migration.RoleSource, Container: name, Peer: req.To, Strategy: req.Strategy,
			ImageDir: filepath.Join(a.scratchDir(), name+"-out")}}, nil
}

// runOutgoing starts o's job; the container stays claimed until it ends.
func (a *Agent) runOutgoing(o *outgoing) *job {
	name := o.rec.Container
	jctx, cancel := context.WithCancelCause(a.runCtx)
	j := newJob(o.rec.ID, migration.RoleSource, name, a.cfg.Node, o.req.To, o.req.Strategy, cancel)
	o.job = j
	a.jobs.add(j)
	a.metrics.MigrationStarted(migration.RoleSource)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer cancel(nil)
		defer a.release(name)
		o.run(jctx)
	}()
	return j
}

// outgoing drives the source side of one migration: it performs the
// actions of its migration.Source and reports their outcome as events.
// Its fields belong to the goroutine running it.
type outgoing struct {
	a    *Agent
	job  *job
	m    *migration.Source
	rec  journal.Record
	req  migration.Request
	c    *container
	peer Peer
	send transfer.SendOptions
	comp transfer.Compression
	// dumpAs are the real ids CRIU dumps with (checkDumpable).
	dumpAs *runc.IDs
	// unit is the group migration this one is a member of (nil: alone).
	unit *unit
	// synHold holds the connection requests that arrive from just
	// before the freeze (holdNewConnections).
	synHold *netplane.Holder
	// frozenHold holds, from the freeze on, what else arrives for the
	// service (prepareFrozenHold): nil when its link goes down instead.
	frozenHold *netplane.Holder
	// pid is the service's init process; opens its namespace's count of
	// accepted connections when the migration was prepared.
	pid   int
	opens int64

	tm        *migration.Timer
	res       migration.Result
	conn      *transfer.Conn
	rss       int64
	warm      *linux.Reserve
	criuPages string // CRIU's page server (post-copy, hybrid)
	proxyL    net.Listener
	pageToken string
	pre       *precopy.Source
	layer     layerSnapshot
	// layerSums has the blocks of the layer's large files as the live
	// copy sent them: their changes go as patches (diffLayer).
	layerSums *blockdiff.Index
	lazyStats lazyproxy.Stats
	paused    bool
	budget    time.Duration
	fctx      context.Context // the frozen window: bounded by the budget
	fcancel   context.CancelFunc
	ck        *checkpoint // the dump, from just before the freeze
	final     *finalSend  // pre-copy: the final delta, sent while CRIU dumps
	// layerFirst: stop-and-copy's and post-copy's layer delta is sent
	// while CRIU dumps (early), the images after
	// (FreezeNotice.LayerFirst).
	layerFirst bool
	// gated: the destination restores at a gate (ReadyNotice), started
	// before the freeze on the live layer (sendLiveLayer).
	gated bool
	// liveLayer: the writable layer (pre-copy: in the rounds) and
	// descriptors.json crossed before the freeze, the layer's delta
	// crosses in the window; layer is the snapshot the delta is taken
	// against.
	liveLayer bool
	early     *earlySend
	// holdsSlot: o holds its share of its slot of the node's concurrent
	// migrations (admit, releaseSlot).
	holdsSlot bool
	peerMsg   chan peerMessage
	cleanup   []func()
}

// finalSend is pre-copy's final delta on its way while CRIU dumps
// (precopy.DumpWatch): each process's pages cross as soon as CRIU has
// written them, so the transfer overlaps the dump.
type finalSend struct {
	stop     chan struct{} // closed when the dump failed: the stream ends with an abort
	stopOnce sync.Once
	done     chan struct{} // closed with st and err set
	st       precopy.FinalStats
	err      error
}

// halt ends a final delta whose dump failed and waits for it.
func (f *finalSend) halt() {
	f.stopOnce.Do(func() { close(f.stop) })
	<-f.done
}

// earlySend is the writable layer's delta since its live copy on its
// way while CRIU dumps (FreezeNotice.LayerFirst): the service is frozen,
// so its layer no longer changes, and the connection is idle until the
// images are written. The destination's restore, at its gate on the
// live layer, goes on or starts again on it. (A service CRIU had to
// freeze itself sends it after the dump, still before the images.)
type earlySend struct {
	done  chan struct{} // closed with layer and err set (and images, imgErr)
	layer deltaSent
	err   error
	// feed, when set, named the pages images as CRIU wrote them, and the
	// images followed the delta on this stream (imageFeed).
	feed   *imageFeed
	images transfer.Stats
	imgErr error
}

// imageFeed names each pages image (and its pagemap) CRIU closes while it
// dumps (linux.WatchWritten), for transfer.Conn.SendDirAsWritten: a
// stop-and-copy service's memory, nearly all of its images, crosses while
// CRIU goes on with its sockets, files and namespaces, and only the
// small images are left once it is done. CRIU writes each of these images
// once; a name the watch missed (its queue full or overflowed) goes with
// the rest.
type imageFeed struct {
	names chan string   // closed once the dump is done and the watch stopped
	halt  chan struct{} // closed instead when the dump failed
	ended chan struct{} // closed once names or halt is
}

// feedImages starts an imageFeed on the dump's image directory, before
// CRIU writes anything there. It ends as the dump does; nil when the
// directory cannot be watched (the images then go once the dump is done).
func (o *outgoing) feedImages() *imageFeed {
	f := &imageFeed{names: make(chan string, 1024), halt: make(chan struct{}), ended: make(chan struct{})}
	stop, err := linux.WatchWritten(o.rec.ImageDir, func(name string) bool {
		if precopy.IsMemoryImage(name) {
			select {
			case f.names <- name:
			default: // the walk after the dump sends it
			}
		}
		return true
	}, nil)
	if err != nil {
		o.a.log.Warn("the images wait for the whole dump", "container", o.rec.Container, "err", err)
		return nil
	}
	ck := o.ck
	o.cleanup = append(o.cleanup, func() { o.fcancel(); <-f.ended })
	go func() {
		defer close(f.ended)
		ok := false
		select {
		case <-ck.ready:
			ok = true
		case <-ck.done:
			ok = ck.err == nil
		case <-o.fctx.Done():
		}
		stop() // no name is sent after this
		if ok {
			close(f.names)
		} else {
			close(f.halt)
		}
	}()
	return f
}

// sendLiveLayer sends, while the service still runs, its writable layer
// and runc's descriptors.json (written before CRIU's gate): the
// destination starts its restore on them at once, held at its gate, and
// says when it waits there; in the frozen window only the layer's delta
// crosses (startEarly). The snapshot the delta is taken against comes
// before the copy, so nothing written meanwhile escapes it.
func (o *outgoing) sendLiveLayer(ctx context.Context) error {
	upper := filepath.Join(o.a.dir(o.rec.Container), "upper")
	layer := o.pre == nil // pre-copy's went in the rounds, o.layer its snapshot
	if err := o.conn.WriteMsg(ctx, migration.MsgLiveLayer, migration.LiveLayer{Layer: layer}); err != nil {
		return err
	}
	opts := o.send
	if layer {
		snap, err := snapshotLayer(upper)
		if err != nil {
			return fmt.Errorf("writable layer: %w", err)
		}
		sums := blockdiff.NewIndex()
		// The service runs: its files come and go meanwhile (the delta
		// in the frozen window settles them).
		opts.Name, opts.Overlay, opts.Live, opts.Tee = "upper", true, true, teeSums(sums)
		st, err := o.conn.SendDir(ctx, upper, opts)
		if err != nil {
			return fmt.Errorf("send writable layer: %w", err)
		}
		o.addSent(st)
		o.layer, o.layerSums = snap, sums
	}
	opts.Name, opts.Overlay, opts.Live, opts.Tee = "descriptors", false, false, nil
	st, err := o.conn.SendFile(ctx, filepath.Join(o.rec.ImageDir, runc.DescriptorsFile), opts)
	if err != nil {
		return fmt.Errorf("send runc's descriptors: %w", err)
	}
	o.addSent(st)
	o.liveLayer = true
	wctx, cancel := context.WithTimeout(ctx, gateWait)
	defer cancel()
	if err := expectFrom(wctx, o.conn, o.req.To, migration.MsgLiveReady, nil); err != nil {
		return fmt.Errorf("restore on the live layer at %s: %w", o.req.To, err)
	}
	return nil
}

// startEarly sends the writable layer delta since its live copy
// (sendLiveLayer) on a goroutine while CRIU dumps; sendState waits for it
// before the images. Called before CRIU writes, with images the images
// follow the delta on that goroutine as CRIU writes them (feedImages).
func (o *outgoing) startEarly(images bool) {
	e := &earlySend{done: make(chan struct{})}
	o.early = e
	if images {
		e.feed = o.feedImages()
	}
	ctx := o.fctx
	// Whatever ends the migration, the stream is over before the
	// connection is.
	o.cleanup = append(o.cleanup, func() { o.fcancel(); <-e.done })
	go func() {
		defer close(e.done)
		opts := o.send
		opts.Name, opts.Overlay = "upper", true
		upper := filepath.Join(o.a.dir(o.rec.Container), "upper")
		var err error
		if e.layer, err = sendLayerDelta(ctx, o.conn, upper, o.layer, o.layerSums, opts); err != nil {
			e.err = fmt.Errorf("send writable layer delta: %w", err)
			return
		}
		if f := e.feed; f != nil {
			opts = o.send
			opts.Name = "images"
			e.images, e.imgErr = o.conn.SendDirAsWritten(ctx, o.rec.ImageDir, f.names, f.halt, opts)
		}
	}()
}

// startFinal starts the final delta before CRIU may write its first image;
// without a watch of the image directory, sendState sends it once the
// dump is done, as before.
func (o *outgoing) startFinal() {
	w, err := precopy.WatchDump(o.rec.ImageDir, o.a.log.Warn)
	if err != nil {
		o.a.log.Warn("the final delta waits for the whole dump", "container", o.rec.Container, "err", err)
		return
	}
	f := &finalSend{stop: make(chan struct{}), done: make(chan struct{})}
	o.final = f
	o.cleanup = append(o.cleanup, f.halt)
	go func() {
		defer close(f.done)
		defer w.Close()
		f.st, f.err = o.pre.SendFinal(o.fctx, o.conn, o.rec.ImageDir, w, o.ck.ready, f.stop)
	}()
}

// errFrozenBudget is the cause of the frozen window's context when its
// budget runs out.
var errFrozenBudget = migration.ErrFrozenBudget

// run drives the migration to its end; ctx is cancelled by the operator
// (before the freeze only).
func (o *outgoing) run(ctx context.Context) {
	o.tm = migration.NewTimer(nil)
	o.res = migration.Result{ID: o.rec.ID, Container: o.rec.Container, From: o.a.cfg.Node, To: o.req.To, Strategy: o.req.Strategy}
	if err := o.admit(ctx); err != nil {
		// Nothing journaled or touched yet.
		o.finish(migration.Action{Kind: migration.ActFinish, Outcome: migration.OutcomeAborted, Err: err})
		for i := len(o.cleanup) - 1; i >= 0; i-- {
			o.cleanup[i]() // a group member's memberDone
		}
		return
	}
	defer o.releaseSlot()
	o.tm = migration.NewTimer(nil) // its time starts with its slot
	acts, err := o.m.Step(migration.Event{Kind: migration.EvStart})
	if err != nil {
		o.finish(migration.Action{Kind: migration.ActFinish, Outcome: migration.OutcomeAborted, Err: err})
		return
	}
	o.loop(ctx, acts)
}

// loop performs acts and feeds the machine the outcome until it finishes.
func (o *outgoing) loop(ctx context.Context, acts []migration.Action) {
	defer func() {
		for i := len(o.cleanup) - 1; i >= 0; i-- {
			o.cleanup[i]()
		}
	}()
	for {
		ev, done := o.perform(ctx, acts)
		if done {
			return
		}
		var err error
		if acts, err = o.m.Step(ev); err != nil {
			// A driver bug: end as safely as the phase allows.
			o.a.log.Error("migration machine", "migration", o.rec.ID, "err", err)
			if acts, _ = o.m.Step(migration.Event{Kind: migration.EvFailed, Err: err}); acts == nil {
				o.finish(migration.Action{Kind: migration.ActFinish, Outcome: migration.OutcomeLost, Err: err})
				return
			}
		}
	}
}

// perform runs a batch; it returns the event of its awaited action, or
// done when the batch finished the migration.
func (o *outgoing) perform(ctx context.Context, acts []migration.Action) (migration.Event, bool) {
	for _, act := range acts {
		o.job.update(func(p *api.Progress) { p.Phase, p.Step = string(o.m.Phase()), act.Kind.String() })
		switch act.Kind {
		case migration.ActJournal:
			if err := o.journal(act.Phase); err != nil {
				if act.Phase.Final() {
					o.a.log.Error("journal", "migration", o.rec.ID, "phase", act.Phase, "err", err)
					continue
				}
				return migration.Event{Kind: migration.EvJournalFailed, Err: err}, false
			}
		case migration.ActAbortPeer:
			o.abortPeer(act.Err)
		case migration.ActCommit:
			o.commit()
		case migration.ActFinish:
			o.finish(act)
			return migration.Event{}, true
		default:
			return o.do(ctx, act.Kind), false
		}
	}
	return migration.Event{Kind: migration.EvFailed, Err: errors.New("batch without an awaited action")}, false
}

func (o *outgoing) journal(p migration.Phase) error {
	o.rec.Phase = p
	r, err := o.a.journal.Put(o.rec)
	o.rec = r
	return err
}

// do performs one awaited action.
func (o *outgoing) do(ctx context.Context, k migration.ActionKind) migration.Event {
	switch k {
	case migration.ActPrepare:
		return o.event(ctx, migration.EvPrepared, o.prepare(ctx))
	case migration.ActRounds:
		o.a.failpointStop("source-stop-rounds") // the destination waits, prepared
		return o.event(ctx, migration.EvRoundsDone, o.rounds(ctx))
	case migration.ActFreeze:
		// runc and CRIU start now, while the service runs, and wait
		// at the gate that the freeze opens.
		if err := o.startDump(ctx); err != nil {
			return o.event(ctx, migration.EvFrozen, err)
		}
		if o.gated {
			// The destination's restore starts on the live layer now.
			if err := o.sendLiveLayer(ctx); err != nil {
				return o.event(ctx, migration.EvFrozen, err)
			}
		}
		if o.unit != nil {
			// The unit's members freeze together.
			if err := o.unit.arrive(ctx, stageFreeze, o.stateBytes()); err != nil {
				return migration.Event{Kind: migration.EvCancel, Err: err}
			}
		}
		if o.unit != nil {
			// ... and each after the members that depend on it.
			if err := o.unit.awaitDependentsFrozen(ctx, o.rec.Container); err != nil {
				return migration.Event{Kind: migration.EvCancel, Err: err}
			}
		}
		if !o.job.enterFreeze() {
			return migration.Event{Kind: migration.EvCancel, Err: errCancelled}
		}
		err := o.freeze()
		if err == nil && o.unit != nil {
			o.unit.markFrozen(o.rec.Container)
		}
		return o.event(ctx, migration.EvFrozen, err)
	case migration.ActDump:
		return o.frozenEvent(migration.EvDumped, o.dump())
	case migration.ActSend:
		err := o.sendState()
		if err == nil && o.unit != nil {
			// No member commits before every one has sent its state.
			err = o.unit.arrive(o.fctx, stageSent, 0)
		}
		return o.frozenEvent(migration.EvSent, err)
	case migration.ActAwaitOutcome:
		return o.awaitOutcome()
	case migration.ActAskDest:
		return o.askDest()
	case migration.ActAwaitLazy:
		return o.event(ctx, migration.EvLazyDone, o.awaitLazy())
	case migration.ActCheckDest:
		return o.checkDest()
	case migration.ActRelease:
		return o.event(ctx, migration.EvReleased, o.releaseSource())
	case migration.ActResume:
		return o.event(ctx, migration.EvResumed, o.resume())
	case migration.ActRestoreLocal:
		return o.event(ctx, migration.EvResumed, o.restoreLocal())
	}
	return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("source cannot perform %s", k)}
}

// event maps an action's error to the machine's event: success, the
// operator's cancel, the peer's abort, or a failure.
func (o *outgoing) event(ctx context.Context, ok migration.EventKind, err error) migration.Event {
	var pa *peerAbort
	switch {
	case err == nil:
		return migration.Event{Kind: ok}
	case errors.Is(context.Cause(ctx), errCancelled):
		return migration.Event{Kind: migration.EvCancel, Err: errCancelled}
	case errors.As(err, &pa):
		return migration.Event{Kind: migration.EvPeerAborted, Err: err}
	}
	return migration.Event{Kind: migration.EvFailed, Err: err}
}

// frozenEvent is event for the actions bounded by the frozen budget.
func (o *outgoing) frozenEvent(ok migration.EventKind, err error) migration.Event {
	if err != nil && o.fctx != nil && errors.Is(context.Cause(o.fctx), errFrozenBudget) {
		return migration.Event{Kind: migration.EvBudget, Err: fmt.Errorf("%w (%s): %v", errFrozenBudget, o.budget, err)}
	}
	return o.event(context.Background(), ok, err)
}

// peerAbort is the destination's reason for giving up.
type peerAbort struct {
	node, reason string
	// retryAfter: the refusal is temporary (migration.Abort
	// RetryAfterMs); 0: final.
	retryAfter time.Duration
}

func (e *peerAbort) Error() string { return fmt.Sprintf("%s aborted: %s", e.node, e.reason) }

// prepare connects to the destination, describes the service and waits
// until it is ready. The service runs untouched.
func (o *outgoing) prepare(ctx context.Context) error {
	a, name := o.a, o.rec.Container
	lazy, live := o.req.Strategy.Lazy(), o.req.Strategy.Live()
	o.opens, _ = linux.PassiveOpens(o.pid)
	// The dump writes about the service's memory to tmpfs: ready that
	// much now, outside the frozen window (linux.Reserve says why).
	o.rss = cgroupRSS(a.cgroupsPath(name))
	if !lazy {
		o.warm = reserveFor(context.WithoutCancel(ctx), o.rss)
		o.cleanup = append(o.cleanup, func() { o.warm.Close() })
	}
	o.job.update(func(p *api.Progress) { p.BytesTotal, p.BytesLeft = o.rss, o.rss })
	tlsCfg, err := pki.ClientConfig(a.cfg.TLSDir, o.req.To)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	m := o.c.meta
	prep := migration.Prepare{ID: o.rec.ID, Name: m.Name, Image: m.Image, Digest: m.Digest, IP: m.IP, MAC: m.MAC,
		Args: m.Args, Env: m.Env, Cwd: m.Cwd, Process: m.Process, Strategy: o.req.Strategy, From: a.cfg.Node, MemoryBytes: o.rss}
	if o.unit != nil {
		prep.Unit, prep.Members = o.unit.id, o.unit.members
	}
	if lazy {
		// Post-copy: CRIU serves the pages from loopback; the destination
		// reaches it only through an authenticated tunnel with this token.
		// Hybrid: the tunnel reaches a proxy in front of it instead, which
		// sends only the pages the live rounds did not leave there.
		if o.criuPages, err = a.pagePorts.pick(); err != nil {
			return fmt.Errorf("page server port: %w", err)
		}
		prep.PageServer = o.criuPages
		o.rec.PageServer = o.criuPages
		if live {
			var lc net.ListenConfig
			lc.SetMultipathTCP(false)
			if o.proxyL, err = lc.Listen(ctx, "tcp", "127.0.0.1:0"); err != nil {
				return fmt.Errorf("page proxy: %w", err)
			}
			o.cleanup = append(o.cleanup, func() { o.proxyL.Close() })
			prep.PageServer = o.proxyL.Addr().String()
		}
		o.pageToken = a.pages.add(prep.PageServer, o.req.To)
		prep.PageToken = o.pageToken
		o.cleanup = append(o.cleanup, func() { a.pages.remove(o.pageToken) })
	}
	var prepared migration.ReadyNotice
	if err := o.offer(ctx, tlsCfg, prep, &prepared); err != nil {
		return err
	}
	conn := o.conn
	// runc writes descriptors.json before CRIU's gate only when the shim
	// holds CRIU there (without, runc starts as the gate opens).
	o.gated = prepared.GatedRestore && a.rt.Shim != ""
	o.layerFirst = o.gated && !o.req.Strategy.Live()
	if o.comp != transfer.CompressOff {
		if err := conn.WarmCompression(); err != nil {
			return err
		}
	}
	o.tm.Mark(migration.PhasePrepare)
	return nil
}

// rounds runs the live rounds; the service keeps running.
func (o *outgoing) rounds(ctx context.Context) error {
	var err error
	o.layerSums = blockdiff.NewIndex()
	o.pre, o.layer, o.res.Precopy, err = o.a.precopyRounds(ctx, o.conn, o.rec.Container, o.req.Rounds, o.send, o.layerSums)
	o.res.BytesOnWire += o.res.Precopy.LayerBytes
	for _, r := range o.res.Precopy.Rounds {
		o.res.BytesOnWire += r.Bytes
	}
	o.progress()
	if err != nil {
		return fmt.Errorf("pre-copy rounds (service still running on %s, not frozen): %w", o.a.cfg.Node, err)
	}
	o.tm.Mark(migration.PhasePrecopy)
	return nil
}

// freeze hands the traffic to the destination (which holds it), freezes
// the service and takes its network away. It starts the frozen window's
// budget. Of a pod's members, which share one network, the first to
// freeze does the network's part for all (unit.takePodNetwork), and
// holds what they send each other from then on.
func (o *outgoing) freeze() error {
	a, name := o.a, o.rec.Container
	pod := o.c.meta.PodNet != ""
	network := !pod || o.unit == nil || o.unit.takePodNetwork()
	if network {
		o.holdNewConnections()
	}
	o.budget = time.Duration(o.req.MaxFrozenMs) * time.Millisecond
	switch {
	case o.budget > 0:
	case o.unit != nil:
		o.budget = o.unit.budget(o.req.LinkBps)
	default:
		o.budget = migration.FrozenBudget(o.stateBytes(), o.req.LinkBps)
	}
	if o.proxyL != nil {
		pctx, pcancel := context.WithCancel(a.runCtx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = lazyproxy.ServeSource(pctx, o.proxyL, o.criuPages, o.pre.HoldsPage, &o.lazyStats, a.log)
		}()
		o.cleanup = append(o.cleanup, func() { pcancel(); <-done })
	}
	if o.warm != nil {
		wctx, wcancel := context.WithTimeout(a.runCtx, reserveWait)
		_ = o.warm.Wait(wctx)
		wcancel()
		_, _ = o.warm.Release(-1)
		o.tm.Mark(migration.PhaseReserve)
	}
	if network {
		o.prepareFrozenHold()
	}
	// A service that accepts connections and whose traffic cannot be
	// held waits, frozen, for the network switch before its link goes
	// down (below); one that does not is not made to.
	accepting := false
	if o.frozenHold == nil {
		opens, err := linux.PassiveOpens(o.pid)
		accepting = (err == nil && opens > o.opens) || (o.synHold != nil && o.synHold.Held() > 0)
	}
	// What ran since the last phase (runc's and CRIU's start to the
	// gate, the unit's members gathering, connection requests settling)
	// ran with the service up: it is preparation, not the dump.
	o.tm.Mark(migration.PhasePrepare)
	o.res.Started = time.Now().UTC()
	o.tm.Freeze()
	fctx, fcancel := context.WithTimeoutCause(context.WithoutCancel(a.runCtx), o.budget, errFrozenBudget)
	o.fctx, o.fcancel = fctx, fcancel
	o.cleanup = append(o.cleanup, fcancel)
	// The destination takes the service's traffic now and holds it.
	handover := time.Now()
	a.setHandedOver(o.c, true)
	if err := o.conn.WriteMsg(fctx, migration.MsgFrozen, migration.FreezeNotice{Accepting: accepting, PodNetwork: pod && network, LayerFirst: o.layerFirst,
		LayerLive: o.liveLayer}); err != nil {
		return fmt.Errorf("notify %s: %w", o.req.To, err)
	}
	if pod && network && o.unit != nil {
		a.log.Info("first of its pod to freeze: takes the pod's network", "container", name, "pod", o.c.meta.Group)
		o.holdLoopback()
	}
	// Freeze here, polling the cgroup closely (CRIU's own freezer waits
	// 100 ms whenever its first look finds the cgroup still freezing, and
	// `runc pause` would start a process inside the frozen window). CRIU
	// dumps a frozen cgroup as it is, and leaves it frozen if the dump
	// fails (thawed by resume).
	o.paused = true
	if tries, err := linux.FreezeCgroupSeizable(fctx, a.cgroupsPath(name), 20); err != nil {
		o.paused = false
		a.log.Warn("freeze before dump; CRIU freezes instead", "container", name, "err", err)
	} else if tries > 1 {
		a.log.Info("froze again: a task was in a vfork", "container", name, "tries", tries)
	}
	// The network lock (CRIU's is skipped, runc.SkipNetworkLock): the
	// frozen sockets get no packets, and no reset leaves once the dumped
	// tasks are gone. The frozen hold does both without the wait below:
	// what still arrives here before the switch is held and forwarded at
	// the commit. Without it, the link goes down; every way back to this
	// node brings it up again.
	// For a service that accepts connections it waits for the
	// destination's word that the gateways send it the service's traffic
	// (told before this node, takeTraffic): until then packets still
	// arrive here, and the frozen sockets' queues, which the dump takes,
	// and the hold of new connections keep them. A link taken down at
	// once loses them, and a client whose connection request was among
	// them waits for its retransmission (1 s); an established
	// connection's sender retransmits sooner, so a service that accepts
	// none does not wait (its frozen window would be a few ms longer).
	switch {
	case network && o.frozenHold != nil:
		o.frozenHold.Arm()
		if o.synHold != nil {
			o.synHold.Arm() // a group member's requests are held too now
		}
	case network:
		if mac, err := net.ParseMAC(o.c.meta.MAC); err == nil && accepting && !a.fdb.awaitSince(fctx, mac.String(), handover, switchWait) {
			a.log.Warn("no word of the network switch from the destination; taking the link down", "container", name, "waited", switchWait)
		}
		if err := a.plane.SetHostLink(o.c.meta.netOwner(), false); err != nil {
			a.log.Warn("network lock before dump", "container", name, "err", err)
		}
	}
	o.acceptQueued(fctx)
	return nil
}

// prepareFrozenHold sets up the hold of the service's traffic the freeze
// arms (netplane.HoldFrozen), its rules installed while the service still
// runs. If it cannot be, the link goes down at the freeze instead.
func (o *outgoing) prepareFrozenHold() {
	a, name := o.a, o.rec.Container
	h, err := netplane.HoldFrozen(a.nsPath(o.c.meta.netOwner()))
	if err != nil {
		a.log.Warn("hold the frozen service's traffic; its link goes down instead", "container", name, "err", err)
		return
	}
	o.frozenHold = h
	o.releaseAtCleanup(h, "let the traffic held at the freeze in")
}

// releaseAtCleanup ends a hold of the service's traffic with the
// migration: a committed one drops what is left (forwarded to the
// destination since the commit, the link down), one that failed lets it
// in to the service resumed here.
func (o *outgoing) releaseAtCleanup(h *netplane.Holder, what string) {
	o.cleanup = append(o.cleanup, func() {
		if o.res.OK {
			_ = h.Drop()
		} else if err := h.Close(); err != nil {
			o.a.log.Warn(what, "container", o.rec.Container, "err", err)
		}
	})
}

// stateBytes estimates what the frozen window moves: the service's
// memory and its writable layer.
func (o *outgoing) stateBytes() int64 {
	return o.rss + layerBytes(filepath.Join(o.a.dir(o.rec.Container), "upper"))
}

// holdNewConnections makes connection requests wait from here on (held
// in the service's namespace, netplane.HoldNew) and lets those already
// in their handshake complete and be accepted, so that the dump finds no
// half-made connection: CRIU refuses to dump a listening socket with
// connections in its accept queue, and one in its handshake would be
// lost. The service keeps running meanwhile. At the commit the held
// requests are forwarded to the destination through the overlay (held
// there until the service is restored, forwardHeldConnections); if the
// service stays here they are let in.
func (o *outgoing) holdNewConnections() {
	a, name := o.a, o.rec.Container
	ns := a.nsPath(o.c.meta.netOwner())
	var members []netip.Addr // the unit's other members connect at once
	if o.unit != nil {
		a.mu.Lock()
		for _, m := range o.unit.members {
			if c := a.containers[m]; c != nil && m != name && c.meta.IP != o.c.meta.IP {
				if ip, err := netip.ParseAddr(c.meta.IP); err == nil {
					members = append(members, ip)
				}
			}
		}
		a.mu.Unlock()
	}
	h, err := netplane.HoldNew(ns, members...)
	if err != nil {
		a.log.Warn("hold new connections: a connection arriving at the freeze may fail the dump", "container", name, "err", err)
		return
	}
	o.synHold = h
	o.releaseAtCleanup(h, "let held connection requests in")
	if hs, q, err := netplane.WaitSettled(ns, pendingStall, pendingWait, true); err == nil && hs+q > 0 {
		a.log.Info("connections still pending at the freeze", "container", name, "handshaking", hs, "queued", q)
	}
}

// holdLoopback holds, from the first freeze of a pod's members on, what
// they send each other (netplane.HoldLoopback): a member still running
// until its own freeze sends to one frozen or already dumped, whose gone
// sockets would answer with a reset. The packets stay in their senders'
// queues, which the dumps take. The hold ends with the last member's
// migration (unit.memberDone).
func (o *outgoing) holdLoopback() {
	a, name := o.a, o.rec.Container
	h, err := netplane.HoldLoopback(a.nsPath(o.c.meta.netOwner()))
	if err != nil {
		a.log.Warn("hold the pod's loopback: a connection between its members may be reset", "container", name, "err", err)
		return
	}
	o.unit.holdLoop(h)
}

// switchWait bounds the wait for the destination's network switch before
// the source takes the service's link down (it takes a few milliseconds).
const switchWait = 100 * time.Millisecond

// Before the freeze the source waits for connections in their handshake
// or accept queue (a handshake takes a round trip to the client;
// accepting them, the service's time): while their number keeps going
// down, up to pendingWait (a loaded web server drains a queue as long as
// its clients are many), and no longer than pendingStall without progress.
// The service runs meanwhile; only new connections wait. A queue left at
// the freeze thaws the service for a moment (acceptQueued); one that
// outlasts it fails the dump, so the stall is long: WordPress under 200
// clients (16 Apache workers, ~180 connections queued) went more than
// 250 ms without accepting one while it drained its queue.
const (
	pendingStall = time.Second
	pendingWait  = 30 * time.Second
)

// acceptQueued: connections the frozen service had not accepted yet
// (completed just before the freeze, or a service slow to accept) would
// fail the dump; the service is thawed until it has accepted them, then
// frozen again. Its network is down meanwhile, so nothing new arrives.
func (o *outgoing) acceptQueued(ctx context.Context) {
	a, name := o.a, o.rec.Container
	ns := a.nsPath(o.c.meta.netOwner())
	for try := 0; try < 3 && o.paused; try++ {
		_, q, err := netplane.Pending(ns)
		if err != nil || q == 0 {
			return
		}
		a.log.Info("thaw to accept queued connections before the dump", "container", name, "queued", q)
		if err := linux.ThawCgroup(ctx, a.cgroupsPath(name)); err != nil {
			a.log.Warn("thaw for queued connections", "container", name, "err", err)
			return
		}
		_, _, _ = netplane.WaitSettled(ns, 100*time.Millisecond, 100*time.Millisecond, false)
		if _, err := linux.FreezeCgroupSeizable(ctx, a.cgroupsPath(name), 20); err != nil {
			o.paused = false
			a.log.Warn("freeze again after accepting; CRIU freezes instead", "container", name, "err", err)
			return
		}
	}
}

// checkpoint is the service's dump, run by runc from before the freeze.
type checkpoint struct {
	gate   *runc.Gate
	cancel context.CancelFunc // calls it off, or aborts it (lazy: CRIU resumes the service)
	ready  chan struct{}      // closed when the images may be shipped (runc.CheckpointOpts.Ready)
	done   chan struct{}      // closed when runc is done
	err    error              // runc's outcome, once done is closed
}

// wait returns the dump's outcome once runc is done.
func (c *checkpoint) wait() error {
	<-c.done
	return c.err
}

// workDir receives CRIU's dump.log and stats-dump, which stay here: the
// images directory holds only what the destination restores from.
func (o *outgoing) workDir() string { return o.rec.ImageDir + "-work" }

// dumpRemoveWait bounds how long a rollback lets runc finish removing a
// container CRIU dumped before it is killed.
const dumpRemoveWait = 5 * time.Second

// gateWait bounds how long runc may take to start, probe CRIU and reach
// the gate; the service runs meanwhile.
const gateWait = 30 * time.Second

// startDump starts the service's checkpoint and returns once CRIU waits
// at its gate (runc.Gate), before it touches the service: runc's start,
// its CRIU version probe and its preparations fall before the freeze,
// outside the frozen window.
func (o *outgoing) startDump(ctx context.Context) error {
	a, name := o.a, o.rec.Container
	_ = os.RemoveAll(o.rec.ImageDir)
	_ = os.RemoveAll(o.workDir())
	// File locks (a database's fcntl locks on its data files, Apache's
	// and PHP's lock files) are dumped and taken again on restore.
	opts := runc.CheckpointOpts{ImagePath: o.rec.ImageDir, WorkPath: o.workDir(), TCPEstablished: true, FileLocks: true,
		RealIDs: o.dumpAs, Gate: runc.NewGate()}
	ckCtx, cancel := context.WithCancel(context.WithoutCancel(a.runCtx))
	ck := &checkpoint{gate: opts.Gate, cancel: cancel, ready: make(chan struct{}), done: make(chan struct{})}
	opts.Ready = func() { close(ck.ready) }
	if o.req.Strategy.Lazy() {
		opts.LazyPages, opts.PageServer = true, o.criuPages
	}
	o.ck = ck
	// Whatever ends the migration, runc is gone before the next one.
	o.cleanup = append(o.cleanup, func() { cancel(); <-ck.done })
	go func() {
		defer close(ck.done)
		ck.err = a.rt.Checkpoint(ckCtx, name, opts)
	}()
	if err := awaitGate(ctx, ck.gate, ck.done, func() error { return ck.err }); err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	return nil
}

// awaitGate waits, up to gateWait, until runc has started and its CRIU
// waits at gate g, before the freeze; done closes when runc ended first,
// with err its outcome.
func awaitGate(ctx context.Context, g *runc.Gate, done <-chan struct{}, err func() error) error {
	select {
	case <-g.Ready():
		return nil
	case <-done:
		e := err()
		if e == nil {
			e = errors.New("runc exited")
		}
		return fmt.Errorf("ended at its gate: %w", e)
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(gateWait):
		return fmt.Errorf("runc did not reach CRIU within %s", gateWait)
	}
}

// dump lets the checkpoint at its gate dump the frozen service. It
// returns once the images may be shipped: a lazy dump goes on serving
// pages, and runc goes on removing the container (sendState waits for it).
func (o *outgoing) dump() error {
	ck, lazy := o.ck, o.req.Strategy.Lazy()
	if o.pre != nil && !lazy {
		o.startFinal()
	}
	if o.layerFirst && o.paused {
		// Frozen here (not by CRIU): the layer no longer changes.
		o.startEarly(!lazy)
	}
	ck.gate.Open()
	if !lazy {
		// Past the frozen budget runc is killed and CRIU resumes the
		// service.
		context.AfterFunc(o.fctx, ck.cancel)
	}
	var err error
	select {
	case <-ck.ready:
	case <-ck.done:
		// A dump can end before its readiness is seen.
		if err = ck.err; err == nil && lazy {
			err = errors.New("lazy dump ended before its page server was ready")
		}
	case <-o.fctx.Done():
		err = context.Cause(o.fctx)
	}
	if err != nil {
		if o.final != nil {
			// Its stream ends with an abort; the connection stays usable
			// for the reason.
			o.final.halt()
		}
		return fmt.Errorf("dump: %w", err)
	}
	o.tm.Mark(migration.PhaseDump)
	if lazy {
		// A crash with CRIU's page server up and runc waiting on it:
		// the restarted agent must resume the service here.
		o.a.failpoint("lazy-dump-serving")
	}
	if st, serr := runc.ReadDumpStats(o.workDir()); serr == nil && !lazy {
		o.res.CRIU = dumpStatsMap(st)
	}
	// The destination may give up while we stream (disk full, restore
	// impossible): read its messages concurrently, so its reason is what
	// we report rather than a reset connection.
	// (The read outlives the frozen budget: after the commit the answer
	// is awaited without it. Closing the connection ends it.)
	o.peerMsg = make(chan peerMessage, 1)
	go func() {
		typ, body, err := o.conn.ReadMsg(context.WithoutCancel(o.a.runCtx))
		o.peerMsg <- peerMessage{typ, body, err}
	}()
	return nil
}

// sendState sends the images and the writable layer (pre-copy: only what
// the rounds did not leave on the destination).
func (o *outgoing) sendState() error {
	a, name, ctx := o.a, o.rec.Container, o.fctx
	stop := o.watchProgress()
	defer stop()
	opts := o.send
	opts.Name = "images"
	if o.pre != nil && !o.req.Strategy.Lazy() {
		var fst precopy.FinalStats
		var err error
		if o.final != nil {
			<-o.final.done
			fst, err = o.final.st, o.final.err
		} else {
			fst, err = o.pre.SendFinal(ctx, o.conn, o.rec.ImageDir, nil, nil, nil)
		}
		o.res.BytesOnWire += fst.Bytes()
		p := o.res.Precopy
		p.DumpPages, p.HeldPages, p.CopyPages, p.ZeroPages, p.DataPages = fst.Pages, fst.HeldPages, fst.CopyPages, fst.ZeroPages, fst.DataPages
		p.XorPages, p.FinalBytes = fst.XorPages, fst.Bytes()
		p.FinalImages, p.FinalEarly = fst.Images, fst.EarlyImages
		o.res.StateBytes += fst.DumpBytes
		if err != nil {
			return o.peerReason(fmt.Errorf("send final delta: %w", err))
		}
	} else {
		if o.layerFirst {
			if o.early == nil {
				// CRIU froze the service: its layer is still only
				// now that the dump is done.
				o.startEarly(false)
			}
			<-o.early.done
			o.addSent(o.early.layer.st)
			o.early.layer.report(&o.res)
			if o.early.err != nil {
				return o.peerReason(o.early.err)
			}
		}
		var st1 transfer.Stats
		var err error
		if o.early != nil && o.early.feed != nil {
			st1, err = o.early.images, o.early.imgErr
			o.res.ImagesEarly = int(st1.EarlyFiles)
		} else {
			st1, err = o.conn.SendDir(ctx, o.rec.ImageDir, opts)
		}
		if err != nil {
			return o.peerReason(fmt.Errorf("send images: %w", err))
		}
		o.addSent(st1)
		o.res.CompressionNote = st1.AutoNote
	}
	opts.Name, opts.Overlay = "upper", true // whiteouts, opaque dirs, xattrs, hard links
	var st2 transfer.Stats
	var err error
	if o.layerFirst {
		// The layer went first, while CRIU dumped.
	} else if o.pre != nil {
		// Only what changed since the live copy, and what is left.
		var ds deltaSent
		ds, err = sendLayerDelta(ctx, o.conn, filepath.Join(a.dir(name), "upper"), o.layer, o.layerSums, opts)
		st2 = ds.st
		o.res.Precopy.LayerChanged = ds.changed
		ds.report(&o.res)
	} else {
		st2, err = o.conn.SendDir(ctx, filepath.Join(a.dir(name), "upper"), opts)
	}
	if err != nil {
		return o.peerReason(fmt.Errorf("send writable layer: %w", err))
	}
	o.addSent(st2)
	o.tm.Mark(migration.PhaseTransfer)
	// runc removed the dumped container meanwhile; nothing commits
	// before it is done (a lazy dump's runc ends with its pages).
	if !o.req.Strategy.Lazy() {
		if err := o.ck.wait(); err != nil {
			return fmt.Errorf("dump: %w", err)
		}
	}
	return nil
}

// addSent counts a stream of the state in the result.
func (o *outgoing) addSent(st transfer.Stats) {
	o.res.BytesOnWire += st.WireBytes
	o.res.StateBytes += st.PayloadBytes
	o.res.Compressed = o.res.Compressed || st.Compressed
}

// peerReason prefers the destination's own reason, if it gave one, to a
// broken connection.
func (o *outgoing) peerReason(cause error) error {
	select {
	case m := <-o.peerMsg:
		if m.typ == migration.MsgAbort {
			return &peerAbort{node: o.req.To, reason: abortReason(m.body)}
		}
		o.peerMsg <- m
	case <-time.After(time.Second):
	}
	return cause
}

// commit tells the destination, right behind the state, that the
// service is its own once restored (the journal already says so). The
// source's copy leaves this node's table: a peer that asks learns it lives
// there now.
func (o *outgoing) commit() {
	a, name := o.a, o.rec.Container
	if o.fcancel != nil {
		o.fcancel() // no rollback on this side's own account from here on
	}
	a.mu.Lock()
	delete(a.containers, name)
	a.mu.Unlock()
	if o.c.log != nil {
		o.c.log.Close()
	}
	if o.conn == nil {
		return // settled after a restart: the destination reads the journal
	}
	ctx, cancel := context.WithTimeout(a.runCtx, 10*time.Second)
	defer cancel()
	if err := o.conn.WriteMsg(ctx, migration.MsgCommit, struct{}{}); err != nil {
		a.log.Warn("send commit; the destination reads it from our journal", "container", name, "err", err)
	}
	o.forwardHeldConnections()
}

// forwardHeldConnections sends the connection requests held here to the
// service on the destination, which holds them until it is restored:
// their clients are answered then, not after their SYN retransmission
// (1 s); and so the other packets held since the freeze, whose senders
// would otherwise wait for their retransmission timeout. The link goes
// down first (nothing arrives here any more: the overlay points at the
// destination), and the originals are dropped when the holds end. A packet
// that cannot be forwarded is retransmitted by its sender.
func (o *outgoing) forwardHeldConnections() {
	a := o.a
	if o.frozenHold != nil {
		if err := a.plane.SetHostLink(o.c.meta.netOwner(), false); err != nil {
			a.log.Warn("take the link down at the commit", "container", o.rec.Container, "err", err)
		}
	}
	var pkts []netplane.Packet
	if o.synHold != nil {
		pkts = o.synHold.Kept()
	}
	syns := len(pkts)
	if o.frozenHold != nil {
		pkts = append(pkts, o.frozenHold.Kept()...)
	}
	if len(pkts) == 0 {
		return
	}
	mac, err := net.ParseMAC(o.c.meta.MAC)
	if err == nil {
		err = a.plane.SendOverlay(mac, pkts)
	}
	if err != nil {
		a.log.Warn("forward held packets; their senders retransmit", "container", o.rec.Container, "packets", len(pkts), "err", err)
		return
	}
	o.res.ForwardedConnections, o.res.ForwardedPackets = syns, len(pkts)-syns
}

// awaitOutcome waits until the destination serves the service (it
// committed and delivered the held packets, which ends the downtime) or
// hands it back (its restore failed and its copy is gone).
func (o *outgoing) awaitOutcome() migration.Event {
	if o.peerMsg == nil {
		return migration.Event{Kind: migration.EvFailed, Err: errors.New("no connection to the destination")}
	}
	wait := migration.RestoreDeadline(o.res.StateBytes) + migration.RestoreGrace
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var m peerMessage
	select {
	case m = <-o.peerMsg:
	case <-timer.C:
		return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("no answer from %s within %s of the state's arrival", o.req.To, wait)}
	}
	var sw migration.Switched
	if err := m.as(migration.MsgSwitched, &sw); err != nil {
		if m.typ == migration.MsgAbort {
			return migration.Event{Kind: migration.EvPeerAborted, Err: fmt.Errorf("%s handed the service back: %s", o.req.To, abortReason(m.body))}
		}
		return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("%s: %w", o.req.To, err)}
	}
	o.res.DowntimeMs = migration.Ms(o.tm.Downtime())
	o.tm.Mark(migration.PhaseRestore)
	o.tm.Add(migration.PhaseNetwork, sw.NetworkMs)
	o.res.HeldPackets = sw.Held
	dest := sw.Restore
	dest.CRIU = nil // merged into res.CRIU below
	o.res.Destination = &dest
	for k, v := range sw.Restore.CRIU {
		if o.res.CRIU == nil {
			o.res.CRIU = map[string]float64{}
		}
		o.res.CRIU[k] = v
	}
	return migration.Event{Kind: migration.EvSwitched}
}

// askDest learns from the destination's journal, asking until it gives
// one, whether it serves the service or holds no copy; meanwhile the
// service stays frozen here (committed: this side cannot resume it alone).
func (o *outgoing) askDest() migration.Event {
	a := o.a
	if o.conn != nil {
		o.conn.Close()
	}
	dst, ok := a.peers[o.rec.Peer]
	if !ok {
		return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("destination %q is not a configured peer", o.rec.Peer)}
	}
	ctx := a.runCtx
	wait := 100 * time.Millisecond
	for n := 0; ; n++ {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ph, err := dst.PeerPhase(rctx, o.rec.ID)
		cancel()
		switch {
		case errors.Is(err, api.ErrNotFound):
			return migration.Event{Kind: migration.EvPeerGaveUp}
		case err == nil:
			switch migration.Phase(ph.Phase) {
			case migration.Committed, migration.Done:
				return migration.Event{Kind: migration.EvPeerCommitted}
			case migration.Aborted:
				return migration.Event{Kind: migration.EvPeerGaveUp}
			}
		}
		if n%50 == 0 {
			a.log.Warn("committed migration waits for its destination", "container", o.rec.Container, "destination", o.rec.Peer, "phase", ph.Phase, "err", err)
		}
		select {
		case <-ctx.Done():
			return migration.Event{Kind: migration.EvFailed, Err: ctx.Err()}
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// awaitLazy waits until the lazy dump served every page. Losing this node
// or the link before that loses the service: post-copy's risk, which no
// rollback can cover.
func (o *outgoing) awaitLazy() error {
	err := o.ck.wait()
	o.tm.Mark(migration.PhaseLazy)
	o.res.BytesOnWire += o.a.pages.movedBytes(o.pageToken, 2*time.Second)
	if o.res.Precopy != nil {
		o.res.Precopy.LazyHeldPages, o.res.Precopy.LazyDataPages = o.lazyStats.HeldPages.Load(), o.lazyStats.DataPages.Load()
	}
	if err != nil {
		o.a.log.Error("post-copy page transfer failed after the switch: the service on the destination may be broken", "container", o.rec.Container, "err", err)
		return fmt.Errorf("post-copy pages not all delivered: %w", err)
	}
	return nil
}

// checkDestWait bounds how long a source whose post-copy pages failed
// waits for the destination to settle (its agent may be restarting).
const checkDestWait = 90 * time.Second

// checkDest asks the destination, once its journal says the migration
// ended there, whether the service's copy runs: post-copy pages that did
// not all arrive (the destination agent restarted and its lazy-pages
// daemon died with it) may have taken the copy with them, and a service
// that runs nowhere is lost, never ok.
func (o *outgoing) checkDest() migration.Event {
	a := o.a
	dst, ok := a.peers[o.rec.Peer]
	if !ok {
		return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("destination %q is not a configured peer", o.rec.Peer)}
	}
	deadline := time.Now().Add(checkDestWait)
	var last error
	for {
		rctx, cancel := context.WithTimeout(a.runCtx, 2*time.Second)
		ph, err := dst.PeerPhase(rctx, o.rec.ID)
		cancel()
		switch {
		case errors.Is(err, api.ErrNotFound):
			return migration.Event{Kind: migration.EvPeerGaveUp, Err: fmt.Errorf("%s holds no copy", o.rec.Peer)}
		case err != nil:
			last = err
		case migration.Phase(ph.Phase).Final() && ph.Running:
			a.log.Warn("post-copy pages failed, but the destination's copy runs", "container", o.rec.Container, "destination", o.rec.Peer)
			return migration.Event{Kind: migration.EvPeerCommitted}
		case migration.Phase(ph.Phase) == migration.Aborted && a.holdsTasks(a.runCtx, o.rec.Container):
			// Destroyed there for good (journaled aborted, the
			// container gone), and CRIU resumed the tasks here when
			// its page server's session failed: take it back.
			a.log.Warn("post-copy pages failed and the destination destroyed its copy: taking the service back", "container", o.rec.Container, "destination", o.rec.Peer)
			return migration.Event{Kind: migration.EvPeerDestroyed}
		case migration.Phase(ph.Phase).Final():
			return migration.Event{Kind: migration.EvPeerGaveUp,
				Err: fmt.Errorf("the copy on %s does not run (its migration %s there)", o.rec.Peer, ph.Phase)}
		default:
			last = fmt.Errorf("%s at %s", o.rec.Peer, ph.Phase)
		}
		if time.Now().After(deadline) || a.runCtx.Err() != nil {
			return migration.Event{Kind: migration.EvFailed, Err: fmt.Errorf("whether the copy on %s runs is unknown: %w", o.rec.Peer, last)}
		}
		select {
		case <-a.runCtx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// holdsTasks reports whether container name's tasks are here, alive: no
// runc works on it (a dump ended) and runc still knows it, running or
// paused. After a lazy dump that is the failed dump's doing: CRIU resumes
// the tasks when its page server's session fails (cr_dump_finish puts
// them back to TASK_ALIVE, their memory untouched), and `runc
// checkpoint` then fails without destroying them ("container still
// running").
func (a *Agent) holdsTasks(ctx context.Context, name string) bool {
	if len(a.runcProcs(name)) > 0 {
		return false
	}
	st, err := a.rt.State(ctx, name)
	return err == nil && (st.Status == runc.StatusRunning || st.Status == runc.StatusPaused)
}

// releaseSource removes the migrated container's remains here (the runc
// container is already gone after the dump).
func (o *outgoing) releaseSource() error {
	err := o.a.releaseSource(context.WithoutCancel(o.a.runCtx), o.rec.Container)
	_ = os.RemoveAll(o.rec.ImageDir)
	_ = os.RemoveAll(o.workDir())
	o.tm.Mark(migration.PhaseCleanup)
	o.res.SourceFreeMs = migration.Ms(o.tm.Elapsed())
	if err != nil {
		o.a.log.Warn("source cleanup", "container", o.rec.Container, "err", err)
	}
	return err
}

// abortPeer tells the destination this side gives up, and closes the
// connection.
func (o *outgoing) abortPeer(cause error) {
	if o.conn == nil {
		return
	}
	reason := "source gave up"
	if cause != nil {
		reason = cause.Error()
	}
	ctx, cancel := context.WithTimeout(o.a.runCtx, 2*time.Second)
	defer cancel()
	_ = o.conn.WriteMsg(ctx, migration.MsgAbort, migration.Abort{Reason: reason})
	o.conn.Close()
}

// abortDump calls off a dump still at its gate, or ends a lazy dump that
// is still serving pages: CRIU resumes the service, and its connections
// leave the repair mode CRIU leaves them in then. It returns once runc is
// done.
func (o *outgoing) abortDump() {
	ck := o.ck
	if ck == nil {
		return
	}
	if !o.req.Strategy.Lazy() {
		select {
		case <-ck.ready:
			// CRIU is done, the service's tasks are gone: runc only
			// removes the container now. Killed there, it leaves it
			// half removed (restoreLocal copes, but why make it).
			select {
			case <-ck.done:
			case <-time.After(dumpRemoveWait):
			}
		default:
		}
	}
	ck.cancel()
	if err := ck.wait(); err != nil && o.req.Strategy.Lazy() {
		o.a.endTCPRepair(o.rec.Container)
	}
}

// endTCPRepair takes the connections of container name out of the
// repair mode a failed lazy dump leaves them in (linux.EndTCPRepair).
func (a *Agent) endTCPRepair(name string) {
	n, err := linux.EndTCPRepair(a.cgroupsPath(name))
	if err != nil {
		a.log.Warn("take connections out of repair mode", "container", name, "err", err)
	}
	if n > 0 {
		a.log.Info("connections taken out of the repair mode CRIU left them in", "container", name, "connections", n)
	}
}

// resume takes the service back after a failed freeze or dump: CRIU
// resumed it (or never stopped it); thaw, unlock its network and point the
// overlay back here.
func (o *outgoing) resume() error {
	a, name, ctx := o.a, o.rec.Container, context.WithoutCancel(o.a.runCtx)
	o.abortDump()
	netOwner := o.c.meta.netOwner()
	uerr := netplane.Unlock(a.nsPath(netOwner)) // a CRIU configured to lock
	uerr = errors.Join(uerr, linux.ThawCgroup(ctx, a.cgroupsPath(name)))
	uerr = errors.Join(uerr, a.plane.SetHostLink(netOwner, true))
	rerr := a.ensureRunning(ctx, name)
	a.reclaimTraffic(ctx, o.c)
	o.res.DowntimeMs = migration.Ms(o.tm.Downtime())
	o.tm.Mark(migration.PhaseRollback)
	if rerr != nil {
		return errors.Join(rerr, uerr)
	}
	if uerr != nil {
		a.log.Warn("resume after failed dump", "container", name, "err", uerr)
	}
	return nil
}

// restoreLocal brings the service back here from its images after a
// failure past the dump.
func (o *outgoing) restoreLocal() error {
	// Cancelling a lazy dump makes CRIU abort it: the service resumes
	// where it was, with all its memory.
	o.abortDump()
	if o.conn != nil {
		o.conn.Close()
	}
	err := o.a.restoreLocal(context.WithoutCancel(o.a.runCtx), o.c, o.rec.ImageDir, o.paused)
	o.tm.Mark(migration.PhaseRollback)
	o.res.DowntimeMs = migration.Ms(o.tm.Downtime())
	if err != nil {
		return fmt.Errorf("rollback failed, service lost: %w", err)
	}
	return nil
}

// finish records the outcome.
func (o *outgoing) finish(act migration.Action) {
	a := o.a
	res := &o.res
	res.PhasesMs = o.tm.Phases()
	res.TotalMs = migration.Ms(o.tm.Elapsed())
	res.Outcome = act.Outcome
	res.OK = act.Outcome == migration.OutcomeOK
	res.RolledBack = act.Outcome == migration.OutcomeRolledBack
	if act.Err != nil {
		msg := act.Err.Error()
		switch act.Outcome {
		case migration.OutcomeRolledBack:
			msg += fmt.Sprintf(" (service resumed on %s)", a.cfg.Node)
		case migration.OutcomeAborted:
			msg += fmt.Sprintf(" (service still running on %s, never frozen)", a.cfg.Node)
		}
		res.Error = msg
	}
	if res.OK {
		a.log.Info("migrated", "container", res.Container, "to", res.To, "downtime_ms", res.DowntimeMs, "migration", res.ID)
	} else {
		a.log.Warn("migration failed", "container", res.Container, "to", res.To, "strategy", res.Strategy,
			"outcome", act.Outcome, "migration", res.ID, "err", res.Error)
	}
	if act.Outcome != migration.OutcomeUndecided {
		// Images are kept only while the destination may still hand the
		// service back.
		_ = os.RemoveAll(o.rec.ImageDir)
		_ = os.RemoveAll(o.workDir())
		_ = os.RemoveAll(o.rec.ImageDir + "-rollback")
	}
	if o.unit != nil && !res.OK {
		o.unit.fail(res.Container, errors.New(res.Error))
	}
	a.recordHistory(*res)
	a.metrics.ObserveResult(*res, migration.RoleSource)
	o.job.end(act.Outcome, res)
}

// progress reports bytes moved so far.
func (o *outgoing) progress() {
	o.job.update(func(p *api.Progress) {
		p.BytesSent = o.res.BytesOnWire
		if p.BytesTotal > 0 {
			p.BytesLeft = max(p.BytesTotal-p.BytesSent, 0)
		}
	})
}

// watchProgress reports the connection's send rate and what is left while
// a stream runs, every 250 ms; the returned function stops it.
func (o *outgoing) watchProgress() func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	base := o.res.BytesOnWire
	start := o.conn.Sent()
	go func() {
		defer close(stopped)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		last, lastAt := start, time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				n := o.conn.Sent()
				rate := float64(n-last) * 8 / now.Sub(lastAt).Seconds()
				last, lastAt = n, now
				o.job.update(func(p *api.Progress) {
					p.BytesSent = base + n - start
					p.RateBps = rate
					if p.BytesTotal > 0 {
						p.BytesLeft = max(p.BytesTotal-p.BytesSent, 0)
						if rate > 0 {
							p.ETASeconds = float64(p.BytesLeft) * 8 / rate
						}
					}
				})
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// layerBytes is the size of the files under dir (the writable layer, or
// a dump's images).
func layerBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// ensureRunning checks the service survived a failed dump.
func (a *Agent) ensureRunning(ctx context.Context, name string) error {
	st, err := a.rt.State(ctx, name)
	if err != nil {
		return fmt.Errorf("service state after failed dump: %w", err)
	}
	if st.Status != runc.StatusRunning {
		return fmt.Errorf("service is %s after failed dump", st.Status)
	}
	return nil
}

// restoreLocal brings a checkpointed container back on this node, in its
// original namespace: thawed if it still runs (frozen), restored from its
// images in imgDir if it is gone.
func (a *Agent) restoreLocal(ctx context.Context, c *container, imgDir string, thaw bool) error {
	name := c.meta.Name
	st, err := a.rt.State(ctx, name)
	switch {
	case err == nil && (st.Status == runc.StatusRunning || st.Status == runc.StatusPaused):
		// The dump never completed: the processes are still there.
		if err := linux.ThawCgroup(ctx, a.cgroupsPath(name)); err != nil && thaw {
			return fmt.Errorf("thaw: %w", err)
		}
	default:
		// The dump completed. Its runc, stopped before or while it
		// removed the container, may have left it stopped or half
		// removed; either refuses the restore.
		if derr := a.rt.RemoveDumped(ctx, name); derr != nil {
			return fmt.Errorf("remove the dumped container's state: %w", derr)
		}
		if _, serr := os.Stat(filepath.Join(imgDir, "inventory.img")); serr != nil {
			return fmt.Errorf("no checkpoint images in %s to restore from: %w", imgDir, serr)
		}
		// A lazy dump's images lack the pages its page server was to
		// serve; CRIU restoring from them alone reads them forever.
		if runs, lerr := precopy.LazyRuns(imgDir); lerr == nil && len(runs) > 0 {
			return fmt.Errorf("the images in %s are a lazy dump's, %d runs of pages short (they died with CRIU's page server): nothing here to restore from", imgDir, len(runs))
		}
		cgroups, err := a.restoreCgroups(name)
		if err != nil {
			return err
		}
		lf, err := a.openLog(name)
		if err != nil {
			return err
		}
		// Bounded as a destination's restore is: a hung one is killed.
		rctx, cancel := context.WithTimeout(ctx, migration.RestoreDeadline(layerBytes(imgDir)))
		_, err = a.rt.Restore(rctx, name, a.bundle(name), runc.RestoreOpts{ImagePath: imgDir, WorkPath: imgDir + "-rollback", TCPEstablished: true, FileLocks: true, Cgroups: cgroups}, runc.IO{Stdout: lf, Stderr: lf})
		cancel()
		if err != nil {
			lf.Close()
			return err
		}
		a.mu.Lock()
		if c.log != nil {
			c.log.Close()
		}
		c.log = lf
		a.mu.Unlock()
	}
	// The sockets are back: lift the dump's network lock.
	netOwner := c.meta.netOwner()
	if err := netplane.Unlock(a.nsPath(netOwner)); err != nil {
		a.log.Warn("remove CRIU lock chain", "container", name, "err", err)
	}
	if err := a.plane.SetHostLink(netOwner, true); err != nil {
		return err
	}
	a.mu.Lock()
	a.containers[name] = c
	a.mu.Unlock()
	a.reclaimTraffic(ctx, c)
	return nil
}

// reclaimTraffic points the overlay back at this node for a service that
// stayed or came back here: the sticky local bridge entry, then every
// peer's FDB. A peer that cannot be told (the failed destination,
// typically) learns from the endpoint list when it is back, so this is
// not a failure. A pod's members each do it for the pod's network: any
// of them may have handed it over.
func (a *Agent) reclaimTraffic(ctx context.Context, c *container) {
	a.setHandedOver(c, false)
	a.pinHere(c, time.Now())
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := a.announce(actx, a.endpoint(c), false); err != nil {
		a.log.Warn("announce after rollback", "container", c.meta.Name, "err", err)
	}
}

// setHandedOver marks c as handed over to a migration's destination (or
// back).
func (a *Agent) setHandedOver(c *container, v bool) {
	a.mu.Lock()
	c.handedOver = v
	a.mu.Unlock()
}

// releaseSource removes the migrated container's remains here (runc
// normally removed the container after the dump).
func (a *Agent) releaseSource(ctx context.Context, name string) error {
	var errs []error
	// Stopped or half removed by a runc stopped early, the service
	// could not come back here under its name.
	errs = append(errs, a.rt.RemoveDumped(ctx, name))
	m := a.readMeta(name)
	errs = append(errs, linux.Unmount(a.rootfs(name)))
	errs = append(errs, os.RemoveAll(a.dir(name)))
	a.mu.Lock()
	delete(a.containers, name)
	a.mu.Unlock()
	errs = append(errs, a.releaseNet(m))
	return errors.Join(errs...)
}

// peerMessage is one message read from the peer.
type peerMessage struct {
	typ  string
	body json.RawMessage
	err  error
}

// as requires the message to be typ and decodes it into v; an abort
// becomes a *peerAbort with the peer's reason.
func (m peerMessage) as(typ string, v any) error {
	if m.err != nil {
		return m.err
	}
	if m.typ == migration.MsgAbort {
		return &peerAbort{node: "peer", reason: abortReason(m.body), retryAfter: abortRetry(m.body)}
	}
	if m.typ != typ {
		return fmt.Errorf("protocol: got %q, want %q", m.typ, typ)
	}
	if v != nil {
		return decodePeerMsg(typ, m.body, v)
	}
	return nil
}

// maxPeerMsgBytes bounds a control message's body: the largest, a
// Prepare or a Switched report, are a few kilobytes.
const maxPeerMsgBytes = 1 << 20

// decodePeerMsg decodes a peer's control message strictly: one JSON
// value, no field the message does not have, within maxPeerMsgBytes.
func decodePeerMsg(typ string, body []byte, v any) error {
	if len(body) > maxPeerMsgBytes {
		return fmt.Errorf("protocol: %s message of %d bytes (at most %d)", typ, len(body), maxPeerMsgBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("protocol: %s message: %w", typ, err)
	}
	if dec.More() {
		return fmt.Errorf("protocol: %s message: data after the JSON value", typ)
	}
	return nil
}

// abortReason is the reason an abort message gives, or says that it
// could not be read.
func abortReason(body []byte) string {
	var ab migration.Abort
	if err := decodePeerMsg(migration.MsgAbort, body, &ab); err != nil {
		return "(unreadable abort: " + err.Error() + ")"
	}
	const max = 4096
	if len(ab.Reason) > max {
		ab.Reason = ab.Reason[:max] + "…"
	}
	return ab.Reason
}

// abortRetry is how long an abort asks its receiver to wait before it
// asks again (0: the refusal is final), at most a minute.
func abortRetry(body []byte) time.Duration {
	var ab migration.Abort
	if decodePeerMsg(migration.MsgAbort, body, &ab) != nil || ab.RetryAfterMs <= 0 {
		return 0
	}
	return min(time.Duration(ab.RetryAfterMs)*time.Millisecond, time.Minute)
}

// from is as, with an abort naming node.
func (m peerMessage) from(node, typ string, v any) error {
	err := m.as(typ, v)
	var pa *peerAbort
	if errors.As(err, &pa) {
		pa.node = node
	}
	return err
}

// expectFrom reads the next message and requires typ; an abort becomes a
// *peerAbort naming node.
func expectFrom(ctx context.Context, conn *transfer.Conn, node, typ string, v any) error {
	got, body, err := conn.ReadMsg(ctx)
	return peerMessage{got, body, err}.from(node, typ, v)
}

// expect is expectFrom without a node name.
func expect(ctx context.Context, conn *transfer.Conn, typ string, v any) error {
	return expectFrom(ctx, conn, "peer", typ, v)
}

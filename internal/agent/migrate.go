package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/edgehop/edgehop/internal/api"
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

// Migrate moves container name to node req.To and reports what happened.
// Whatever fails after the freeze, the service is resumed here.
func (a *Agent) Migrate(ctx context.Context, name string, req migration.Request) (res migration.Result, err error) {
	res = migration.Result{Container: name, From: a.cfg.Node, To: req.To, Strategy: req.Strategy}
	if req.To == a.cfg.Node {
		return res, fmt.Errorf("%w: %s already runs on %s", ErrInvalid, name, req.To)
	}
	lazy, live := req.Strategy.Lazy(), req.Strategy.Live()
	switch req.Strategy {
	case migration.StopAndCopy, migration.PostCopy, migration.PreCopy, migration.Hybrid:
	default:
		return res, fmt.Errorf("%w: strategy %q is not available on the agent (stop-and-copy, post-copy, pre-copy, hybrid; auto is resolved by the CLI)", ErrInvalid, req.Strategy)
	}
	if req.Rounds < 0 {
		return res, fmt.Errorf("%w: rounds %d < 0", ErrInvalid, req.Rounds)
	}
	comp := transfer.CompressAuto
	if req.Compression != "" {
		if comp, err = transfer.ParseCompression(req.Compression); err != nil {
			return res, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	send := transfer.SendOptions{Compression: comp, LinkBitsPerSecond: max(req.LinkBps, 0)}
	peer, err := a.peer(req.To)
	if err != nil {
		return res, err
	}
	c, err := a.claimWhenFree(ctx, name, 5*time.Second)
	if err != nil {
		return res, err
	}
	defer a.release(name)
	st, err := a.rt.State(ctx, name)
	if err != nil || st.Status != runc.StatusRunning {
		status := string(st.Status)
		if err != nil {
			status = "gone"
		}
		return res, fmt.Errorf("%w: %s is not running on %s (status %s), so there is nothing to migrate; see 'edgehop logs %s'", ErrInvalid, name, a.cfg.Node, status, name)
	}
	if err := a.checkDumpable(name, st.Pid); err != nil {
		return res, err
	}
	// The dump writes about the service's memory to tmpfs: ready that
	// much now, outside the frozen window (linux.Reserve says why).
	rss := cgroupRSS(a.cgroupsPath(name))
	var warm *linux.Reserve
	if !lazy {
		warm = reserveFor(context.WithoutCancel(ctx), rss)
	}
	defer warm.Close()
	tm := migration.NewTimer(nil)
	defer func() {
		res.PhasesMs = tm.Phases()
		res.TotalMs = migration.Ms(tm.Elapsed())
		res.OK = err == nil
		if err != nil {
			res.Error = err.Error()
			a.log.Warn("migration failed", "container", name, "to", req.To, "strategy", req.Strategy,
				"rolled_back", res.RolledBack, "err", err)
		}
		a.recordHistory(res)
	}()

	tlsCfg, err := pki.ClientConfig(a.cfg.TLSDir, req.To)
	if err != nil {
		return res, fmt.Errorf("tls: %w", err)
	}
	conn, err := transfer.Dial(ctx, peer.Migrate, tlsCfg)
	if err != nil {
		return res, fmt.Errorf("connect to %s: %w", req.To, err)
	}
	defer conn.Close()
	m := c.meta
	prep := migration.Prepare{Name: m.Name, Image: m.Image, Digest: m.Digest, IP: m.IP, MAC: m.MAC,
		Args: m.Args, Env: m.Env, Cwd: m.Cwd, Strategy: req.Strategy, From: a.cfg.Node, MemoryBytes: rss}
	var criuPages string // CRIU's page server (post-copy, hybrid)
	var proxyL net.Listener
	if lazy {
		// Post-copy: CRIU serves the pages from loopback; the destination
		// reaches it only through an authenticated tunnel with this token.
		// Hybrid: the tunnel reaches a proxy in front of it instead, which
		// sends only the pages the live rounds did not leave there.
		if criuPages, err = a.pagePorts.pick(); err != nil {
			return res, fmt.Errorf("page server port: %w", err)
		}
		prep.PageServer = criuPages
		if live {
			var lc net.ListenConfig
			lc.SetMultipathTCP(false)
			if proxyL, err = lc.Listen(ctx, "tcp", "127.0.0.1:0"); err != nil {
				return res, fmt.Errorf("page proxy: %w", err)
			}
			defer proxyL.Close()
			prep.PageServer = proxyL.Addr().String()
		}
		prep.PageToken = a.pages.add(prep.PageServer)
		defer a.pages.remove(prep.PageToken)
	}
	if err := conn.WriteMsg(ctx, migration.MsgPrepare, prep); err != nil {
		return res, fmt.Errorf("prepare %s: %w", req.To, err)
	}
	if err := expect(ctx, conn, migration.MsgPrepared, nil); err != nil {
		return res, fmt.Errorf("prepare on %s: %w", req.To, err)
	}
	if comp != transfer.CompressOff {
		if err := conn.WarmCompression(); err != nil {
			return res, err
		}
	}
	tm.Mark(migration.PhasePrepare)

	var pre *precopy.Source
	var layer layerSnapshot
	if live {
		// The service keeps running: any failure here leaves it as it is.
		pre, layer, res.Precopy, err = a.precopyRounds(ctx, conn, name, req.Rounds, send)
		res.BytesOnWire += res.Precopy.LayerBytes
		for _, r := range res.Precopy.Rounds {
			res.BytesOnWire += r.Bytes
		}
		if err != nil {
			_ = conn.WriteMsg(context.WithoutCancel(ctx), migration.MsgAbort, migration.Abort{Reason: "pre-copy failed on source"})
			return res, fmt.Errorf("pre-copy rounds (service still running on %s, not frozen): %w", a.cfg.Node, err)
		}
		tm.Mark(migration.PhasePrecopy)
	}
	var lazyStats lazyproxy.Stats
	if proxyL != nil {
		pctx, pcancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = lazyproxy.ServeSource(pctx, proxyL, criuPages, pre.HoldsPage, &lazyStats, a.log)
		}()
		defer func() { pcancel(); <-done }()
	}

	imgDir := filepath.Join(a.scratchDir(), name+"-out")
	_ = os.RemoveAll(imgDir)
	defer os.RemoveAll(imgDir)
	// The result is reported as such (not as a refused request) from the
	// freeze on.
	if warm != nil {
		wctx, wcancel := context.WithTimeout(ctx, reserveWait)
		_ = warm.Wait(wctx)
		wcancel()
		_, _ = warm.Release(-1)
		tm.Mark(migration.PhaseReserve)
	}
	res.Started = time.Now().UTC()
	tm.Freeze()
	// The destination takes the service's traffic now and holds it.
	a.setHandedOver(c, true)
	if err := conn.WriteMsg(ctx, migration.MsgFrozen, struct{}{}); err != nil {
		a.setHandedOver(c, false)
		return res, fmt.Errorf("notify %s: %w", req.To, err)
	}
	// Freeze here, polling the cgroup closely (CRIU's own freezer waits
	// 100 ms whenever its first look finds the cgroup still freezing, and
	// `runc pause` would start a process inside the frozen window). CRIU
	// dumps a frozen cgroup as it is, and leaves it frozen if the dump
	// fails (thawed below).
	paused := true
	if tries, err := linux.FreezeCgroupSeizable(ctx, a.cgroupsPath(name), 20); err != nil {
		paused = false
		a.log.Warn("freeze before dump; CRIU freezes instead", "container", name, "err", err)
	} else if tries > 1 {
		a.log.Info("froze again: a task was in a vfork", "container", name, "tries", tries)
	}
	// The network lock (CRIU's is skipped, runc.SkipNetworkLock): the
	// frozen sockets get no packets, and no reset leaves once the dumped
	// tasks are gone. Every way back to this node brings it up again.
	if err := a.plane.SetHostLink(name, false); err != nil {
		a.log.Warn("network lock before dump", "container", name, "err", err)
	}
	ckOpts := runc.CheckpointOpts{ImagePath: imgDir, WorkPath: imgDir, TCPEstablished: true}
	ckCtx, ckCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer ckCancel()
	ckDone := make(chan error, 1)
	if lazy {
		ready := make(chan struct{})
		ckOpts.LazyPages, ckOpts.PageServer = true, criuPages
		ckOpts.Ready = func() { close(ready) }
		go func() { ckDone <- a.rt.Checkpoint(ckCtx, name, ckOpts) }()
		select {
		case <-ready:
		case err = <-ckDone:
			if err == nil {
				err = errors.New("lazy dump ended before its page server was ready")
			}
		case <-ctx.Done():
			err = ctx.Err()
		}
	} else {
		err = a.rt.Checkpoint(ctx, name, ckOpts)
	}
	if err != nil {
		// CRIU resumes the service when a dump fails, but leaves its lock;
		// the destination already took the traffic: point it back here.
		ckCancel()
		uerr := netplane.Unlock(a.nsPath(name)) // a CRIU configured to lock
		if paused {
			uerr = errors.Join(uerr, linux.ThawCgroup(context.WithoutCancel(ctx), a.cgroupsPath(name)))
		}
		uerr = errors.Join(uerr, a.plane.SetHostLink(name, true))
		_ = conn.WriteMsg(context.WithoutCancel(ctx), migration.MsgAbort, migration.Abort{Reason: "dump failed on source"})
		rerr := a.ensureRunning(context.WithoutCancel(ctx), name)
		a.reclaimTraffic(context.WithoutCancel(ctx), c)
		res.DowntimeMs = migration.Ms(tm.Downtime())
		if rerr == nil {
			res.RolledBack = true
			err = fmt.Errorf("%w (service resumed on %s)", err, a.cfg.Node)
		}
		return res, errors.Join(fmt.Errorf("dump: %w", err), uerr, rerr)
	}
	tm.Mark(migration.PhaseDump)
	if st, serr := runc.ReadDumpStats(imgDir); serr == nil && !lazy {
		res.CRIU = dumpStatsMap(st)
	}

	// From here on the service is frozen: every failure rolls back.
	rollback := func(cause error) (migration.Result, error) {
		_ = conn.WriteMsg(context.WithoutCancel(ctx), migration.MsgAbort, migration.Abort{Reason: cause.Error()})
		conn.Close()
		if lazy {
			// Cancelling a lazy dump makes CRIU abort it: the service
			// resumes where it was, with all its memory.
			ckCancel()
			<-ckDone
		}
		rerr := a.restoreLocal(context.WithoutCancel(ctx), c, imgDir)
		tm.Mark(migration.PhaseRollback)
		res.RolledBack = rerr == nil
		res.DowntimeMs = migration.Ms(tm.Downtime())
		if rerr != nil {
			return res, errors.Join(cause, fmt.Errorf("rollback failed, service lost: %w", rerr))
		}
		return res, fmt.Errorf("%w (service resumed on %s)", cause, a.cfg.Node)
	}

	// The destination may give up while we stream (disk full, restore
	// impossible): read its messages concurrently, so its reason is what
	// we report rather than a reset connection.
	peerMsg := make(chan peerMessage, 1)
	go func() {
		typ, body, err := conn.ReadMsg(ctx)
		peerMsg <- peerMessage{typ, body, err}
	}()
	peerReason := func(cause error) error {
		select {
		case m := <-peerMsg:
			if m.typ == migration.MsgAbort {
				var ab migration.Abort
				_ = json.Unmarshal(m.body, &ab)
				return fmt.Errorf("%s aborted: %s", req.To, ab.Reason)
			}
		case <-time.After(time.Second):
		}
		return cause
	}
	opts := send
	opts.Name = "images"
	if pre != nil && !lazy {
		// Only what the rounds did not leave on the destination.
		fst, err := pre.SendFinal(ctx, conn, imgDir)
		res.BytesOnWire += fst.Bytes()
		p := res.Precopy
		p.DumpPages, p.HeldPages, p.CopyPages, p.ZeroPages, p.DataPages = fst.Pages, fst.HeldPages, fst.CopyPages, fst.ZeroPages, fst.DataPages
		p.FinalBytes = fst.Bytes()
		res.StateBytes += fst.DumpBytes
		if err != nil {
			return rollback(peerReason(fmt.Errorf("send final delta: %w", err)))
		}
	} else {
		st1, err := conn.SendDir(ctx, imgDir, opts)
		if err != nil {
			return rollback(peerReason(fmt.Errorf("send images: %w", err)))
		}
		res.BytesOnWire += st1.WireBytes
		res.StateBytes += st1.PayloadBytes
		res.Compressed = st1.Compressed
		res.CompressionNote = st1.AutoNote
	}
	opts.Name, opts.Overlay = "upper", true // whiteouts, opaque dirs, xattrs, hard links
	var st2 transfer.Stats
	if pre != nil {
		// Only what changed since the live copy, and what is left.
		var n int
		st2, n, err = sendLayerDelta(ctx, conn, filepath.Join(a.dir(name), "upper"), layer, opts)
		res.Precopy.LayerChanged = n
	} else {
		st2, err = conn.SendDir(ctx, filepath.Join(a.dir(name), "upper"), opts)
	}
	if err != nil {
		return rollback(peerReason(fmt.Errorf("send writable layer: %w", err)))
	}
	res.BytesOnWire += st2.WireBytes
	res.StateBytes += st2.PayloadBytes
	res.Compressed = res.Compressed || st2.Compressed
	tm.Mark(migration.PhaseTransfer)

	var restored migration.Restored
	var m1 peerMessage
	wait := migration.RestoreDeadline(res.StateBytes) + migration.RestoreGrace
	restoreTimer := time.NewTimer(wait)
	select {
	case m1 = <-peerMsg:
	case <-ctx.Done():
		m1.err = ctx.Err()
	case <-restoreTimer.C:
		m1.err = fmt.Errorf("no answer within %s of the images' arrival", wait)
	}
	restoreTimer.Stop()
	if err := m1.as(migration.MsgRestored, &restored); err != nil {
		return rollback(fmt.Errorf("restore on %s: %w", req.To, err))
	}
	tm.Mark(migration.PhaseRestore)
	dest := restored
	dest.CRIU = nil // merged into res.CRIU below
	res.Destination = &dest
	tm.Add(migration.PhaseNetwork, restored.NetworkMs)
	res.HeldPackets = restored.Held
	for k, v := range restored.CRIU {
		if res.CRIU == nil {
			res.CRIU = map[string]float64{}
		}
		res.CRIU[k] = v
	}

	// The service answers again: the destination restored it with the
	// network already pointing at it and delivered what it held.
	res.DowntimeMs = migration.Ms(tm.Downtime())

	// Commit point: the service now belongs to the destination. It is
	// dropped from this node's table first, so a destination that loses
	// this connection and asks us learns it must switch.
	a.mu.Lock()
	delete(a.containers, name)
	a.mu.Unlock()
	if c.log != nil {
		c.log.Close()
	}
	var sw migration.Switched
	cerr := conn.WriteMsg(ctx, migration.MsgCommit, struct{}{})
	if cerr == nil {
		cerr = expect(ctx, conn, migration.MsgSwitched, &sw)
	}
	tm.Mark(migration.PhaseCommit)
	if cerr != nil {
		a.log.Warn("no switch confirmation; destination decides from our state", "container", name, "err", cerr)
	}

	if lazy {
		// The service runs on the destination; its memory still comes
		// from here. The dump returns once every page was fetched. Losing
		// this node or the link before that loses the service: post-copy's
		// risk, which rollback cannot cover.
		if err := <-ckDone; err != nil {
			a.log.Error("post-copy page transfer failed after the switch: the service on the destination may be broken", "container", name, "err", err)
			res.Error = fmt.Sprintf("post-copy pages not all delivered: %v", err)
		}
		tm.Mark(migration.PhaseLazy)
		res.BytesOnWire += a.pages.movedBytes(prep.PageToken, 2*time.Second)
		if res.Precopy != nil {
			res.Precopy.LazyHeldPages, res.Precopy.LazyDataPages = lazyStats.HeldPages.Load(), lazyStats.DataPages.Load()
		}
	}
	// Release the source.
	if err := a.releaseSource(context.WithoutCancel(ctx), name); err != nil {
		a.log.Warn("source cleanup", "container", name, "err", err)
	}
	tm.Mark(migration.PhaseCleanup)
	res.SourceFreeMs = migration.Ms(tm.Elapsed())
	a.log.Info("migrated", "container", name, "to", req.To, "downtime_ms", res.DowntimeMs)
	return res, nil
}

// ensureRunning restores nothing; it checks the service survived a failed
// dump and reports if it did not.
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

// restoreLocal brings a checkpointed container back on this node from its
// images, in its original namespace.
func (a *Agent) restoreLocal(ctx context.Context, c *container, imgDir string) error {
	name := c.meta.Name
	if st, err := a.rt.State(ctx, name); err != nil || st.Status != runc.StatusRunning {
		lf, err := os.OpenFile(a.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		if _, err := a.rt.Restore(ctx, name, a.bundle(name), runc.RestoreOpts{ImagePath: imgDir, WorkPath: imgDir + "-rollback", TCPEstablished: true}, runc.IO{Stdout: lf, Stderr: lf}); err != nil {
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
	if err := a.plane.SetHostLink(name, true); err != nil {
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
// not a failure.
func (a *Agent) reclaimTraffic(ctx context.Context, c *container) {
	a.setHandedOver(c, false)
	mac, _ := net.ParseMAC(c.meta.MAC)
	a.fdb.stamp(mac.String(), time.Now())
	if err := a.plane.DelRemote(mac); err != nil {
		a.log.Warn("drop remote fdb", "container", c.meta.Name, "err", err)
	}
	if err := a.plane.PinLocal(mac, c.meta.Name); err != nil {
		a.log.Warn("pin local fdb", "container", c.meta.Name, "err", err)
	}
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

// releaseSource removes the migrated container's remains here (the runc
// container is already gone after the dump).
func (a *Agent) releaseSource(ctx context.Context, name string) error {
	var errs []error
	if _, err := a.rt.State(ctx, name); err == nil {
		errs = append(errs, a.rt.Delete(ctx, name, true))
	}
	errs = append(errs, a.plane.Detach(name), linux.Unmount(a.rootfs(name)), linux.DeleteNetNS(a.nsPath(name)))
	errs = append(errs, os.RemoveAll(a.dir(name)))
	return errors.Join(errs...)
}

// peerMessage is one message read from the peer.
type peerMessage struct {
	typ  string
	body json.RawMessage
	err  error
}

// as requires the message to be typ and decodes it into v; an abort
// becomes an error with the peer's reason.
func (m peerMessage) as(typ string, v any) error {
	if m.err != nil {
		return m.err
	}
	if m.typ == migration.MsgAbort {
		var ab migration.Abort
		_ = json.Unmarshal(m.body, &ab)
		return fmt.Errorf("peer aborted: %s", ab.Reason)
	}
	if m.typ != typ {
		return fmt.Errorf("protocol: got %q, want %q", m.typ, typ)
	}
	if v != nil {
		return json.Unmarshal(m.body, v)
	}
	return nil
}

// expect reads the next message and requires typ; an abort becomes an
// error with the peer's reason.
func expect(ctx context.Context, conn *transfer.Conn, typ string, v any) error {
	got, body, err := conn.ReadMsg(ctx)
	return peerMessage{got, body, err}.as(typ, v)
}

// serveMigrations accepts incoming migrations until ctx ends.
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
			typ, body, err := conn.ReadMsg(ctx)
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
			if err := a.receive(ctx, conn, typ, body); err != nil {
				a.log.Warn("incoming migration failed", "from", conn.Peer(), "err", err)
			}
		}()
	}
}

// receive is the destination side of a migration.
func (a *Agent) receive(ctx context.Context, conn *transfer.Conn, typ string, body json.RawMessage) (err error) {
	if typ != migration.MsgPrepare {
		return fmt.Errorf("protocol: got %q, want prepare", typ)
	}
	var p migration.Prepare
	if err := json.Unmarshal(body, &p); err != nil {
		return err
	}
	fail := func(err error) error {
		_ = conn.WriteMsg(context.WithoutCancel(ctx), migration.MsgAbort, migration.Abort{Reason: fmt.Sprintf("%s: %v", a.cfg.Node, err)})
		return err
	}
	if a.cfg.Role != RoleNode {
		return fail(fmt.Errorf("%s does not run containers", a.cfg.Node))
	}
	if _, err := a.claim(p.Name, false); err != nil {
		return fail(err)
	}
	defer a.release(p.Name)
	committed := false
	defer func() {
		if !committed {
			_ = a.destroy(context.WithoutCancel(ctx), p.Name)
		}
	}()

	// Prepare before the source freezes: rootfs base, namespace with the
	// same IP and MAC, and the Holder, which keeps every packet for the
	// service away from the namespace's stack until the restore is done
	// (so none meets a missing socket and draws a reset). CRIU's own lock
	// is skipped (runc.SkipNetworkLock).
	ip, err := netip.ParseAddr(p.IP)
	if err != nil {
		return fail(err)
	}
	lower, digest, err := a.imageFor(ctx, p.Image, p.Digest)
	if err != nil {
		return fail(err)
	}
	m := meta{Name: p.Name, Image: p.Image, Digest: digest, IP: p.IP, MAC: p.MAC, Args: p.Args, Env: p.Env, Cwd: p.Cwd, Created: time.Now().UTC(), Incoming: true}
	if err := os.MkdirAll(a.dir(p.Name), 0o755); err != nil {
		return fail(err)
	}
	if err := a.writeMeta(m); err != nil {
		return fail(err)
	}
	ns := a.nsPath(p.Name)
	if err := linux.NewNetNS(ns); err != nil {
		return fail(err)
	}
	ep := netplane.Endpoint{Container: p.Name, NetNSPath: ns, Addr: netip.PrefixFrom(ip, a.cfg.Overlay.Bits()), Gateway: a.cfg.Gateway}
	if err := a.plane.Attach(ep, false); err != nil {
		return fail(err)
	}
	holder, err := netplane.Hold(ns)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if holder != nil {
			_ = holder.Drop()
		}
	}()
	if err := runc.WriteBundle(a.bundle(p.Name), a.runcSpec(m)); err != nil {
		return fail(err)
	}
	imgDir := filepath.Join(a.scratchDir(), p.Name+"-in")
	_ = os.RemoveAll(imgDir)
	defer os.RemoveAll(imgDir)
	var store *precopy.Store
	if p.Strategy.Live() {
		if store, err = precopy.NewStore(filepath.Join(a.scratchDir(), p.Name+"-store"), a.log); err != nil {
			return fail(err)
		}
		defer store.Close()
	}
	if err := conn.WriteMsg(ctx, migration.MsgPrepared, struct{}{}); err != nil {
		return err
	}

	// Live rounds (pre-copy) until the source freezes; then take its
	// traffic (held until restored).
	// Ready memory for the images and the restored process while the
	// source works; half is given back for the images when it freezes,
	// the rest just before the restore.
	var warm *linux.Reserve
	if !p.Strategy.Lazy() {
		warm = reserveFor(context.WithoutCancel(ctx), 2*p.MemoryBytes)
	}
	defer warm.Close()
	upper := filepath.Join(a.dir(p.Name), "upper")
	if err := a.receiveRounds(ctx, conn, store, upper); err != nil {
		return err
	}
	_, _ = warm.Release(p.MemoryBytes)
	c := &container{meta: m}
	sw := a.takeTraffic(ctx, c)
	tRecv := time.Now()
	var stateBytes int64 // the images' size, for the restore deadline
	if store != nil && !p.Strategy.Lazy() {
		fst, err := store.RebuildFinal(ctx, conn, imgDir)
		if err != nil {
			return fail(fmt.Errorf("rebuild images from pre-copy: %w", err))
		}
		stateBytes = fst.DumpBytes
	} else {
		rst, err := conn.RecvDir(ctx, imgDir, transfer.RecvOptions{})
		if err != nil {
			return fail(fmt.Errorf("receive images: %w", err))
		}
		stateBytes = rst.PayloadBytes
	}
	if store != nil {
		if err := recvLayerDelta(ctx, conn, upper); err != nil {
			return fail(fmt.Errorf("receive writable layer delta: %w", err))
		}
	} else if _, err := conn.RecvDir(ctx, upper, transfer.RecvOptions{}); err != nil {
		return fail(fmt.Errorf("receive writable layer: %w", err))
	}
	recvMs := migration.Ms(time.Since(tRecv))
	tMount := time.Now()
	if err := linux.MountOverlay(lower, upper, filepath.Join(a.dir(p.Name), "work"), a.rootfs(p.Name)); err != nil {
		return fail(err)
	}
	mountMs := migration.Ms(time.Since(tMount))
	lf, err := os.OpenFile(a.logPath(p.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fail(err)
	}
	lazy := p.Strategy.Lazy()
	work := imgDir + "-work"
	defer os.RemoveAll(work)
	var pagesDaemon *runc.Daemon
	if lazy {
		// Pages come from the source's page server through an
		// authenticated tunnel; the daemon outlives the restore.
		dial, err := a.tunnelDialer(p.From)
		if err != nil {
			lf.Close()
			return fail(err)
		}
		tctx, tcancel := context.WithCancel(context.WithoutCancel(ctx))
		defer tcancel()
		tun, err := transfer.TunnelListen(tctx, "127.0.0.1:0", transfer.TunnelRequest{Target: p.PageServer, Token: p.PageToken}, dial)
		if err != nil {
			lf.Close()
			return fail(fmt.Errorf("page tunnel: %w", err))
		}
		defer tun.Close()
		// A proxy in front of the daemon pulls the dump's lazy runs ahead
		// of it (hybrid: and fills the pages the rounds left here from
		// the store); without the runs, hybrid's proxy relays only.
		runs, rerr := precopy.LazyRuns(imgDir)
		if rerr != nil {
			a.log.Warn("lazy pages: no prefetch (lazy runs unreadable)", "container", p.Name, "err", rerr)
		}
		pageServer := tun.Addr().String()
		if store != nil || rerr == nil {
			if pageServer, err = a.serveLazyPages(tctx, p.Name, pageServer, store, runs); err != nil {
				lf.Close()
				return fail(fmt.Errorf("page proxy: %w", err))
			}
		}
		if pagesDaemon, err = a.rt.StartLazyPages(tctx, runc.LazyPagesOpts{ImagePath: imgDir, WorkPath: work, PageServer: pageServer}); err != nil {
			lf.Close()
			return fail(fmt.Errorf("lazy-pages daemon: %w", err))
		}
		defer pagesDaemon.Stop()
	}
	_, _ = warm.Release(-1)
	t0 := time.Now()
	// A restore that hangs must not keep the service away for good: past
	// the deadline it is killed and the source takes the service back.
	rdl := migration.RestoreDeadline(stateBytes)
	rctx, rcancel := context.WithTimeout(ctx, rdl)
	_, err = a.rt.Restore(rctx, p.Name, a.bundle(p.Name), runc.RestoreOpts{ImagePath: imgDir, WorkPath: work, TCPEstablished: true, LazyPages: lazy}, runc.IO{Stdout: lf, Stderr: lf})
	if err != nil && rctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("no restore within %s (%d bytes of images): %w", rdl, stateBytes, err)
	}
	rcancel()
	if err != nil {
		lf.Close()
		return fail(fmt.Errorf("restore: %w", err))
	}
	held, herr := holder.Release()
	if herr != nil {
		a.log.Warn("release held packets", "container", p.Name, "err", herr)
	}
	// The rule goes once the source has heard (below): it does not delay
	// the service, and packets pass meanwhile.
	released := holder
	holder = nil
	r := migration.Restored{RestoreMs: migration.Ms(time.Since(t0)), NetworkMs: sw.NetworkMs, Held: held, RecvMs: recvMs, MountMs: mountMs}
	if st, err := runc.ReadRestoreStats(work); err == nil {
		r.CRIU = restoreStatsMap(st)
	}
	c.log = lf
	err = conn.WriteMsg(ctx, migration.MsgRestored, r)
	if cerr := released.Close(); cerr != nil {
		a.log.Warn("stop holding", "container", p.Name, "err", cerr)
	}
	if err != nil {
		return a.decideAfterLoss(ctx, c, p.From, err, &committed)
	}
	if err := expect(ctx, conn, migration.MsgCommit, nil); err != nil {
		return a.decideAfterLoss(ctx, c, p.From, err, &committed)
	}
	committed = true
	a.adopt(c)
	_ = conn.WriteMsg(ctx, migration.MsgSwitched, sw)
	if pagesDaemon != nil {
		// Keep the images and the tunnel until every page has arrived.
		if err := pagesDaemon.Wait(context.WithoutCancel(ctx)); err != nil {
			a.log.Error("post-copy: pages not all received", "container", p.Name, "err", err)
		} else {
			a.log.Info("post-copy: all pages received", "container", p.Name, "after_ms", migration.Ms(time.Since(t0)))
		}
	}
	return nil
}

// takeTraffic points the overlay at this node for the service: the local
// bridge entry, then every peer's FDB in parallel. It runs while the source
// dumps; until the restore, the packets are held (netplane.Holder).
func (a *Agent) takeTraffic(ctx context.Context, c *container) migration.Switched {
	t0 := time.Now()
	mac, _ := net.ParseMAC(c.meta.MAC)
	a.fdb.stamp(mac.String(), t0)
	if err := a.plane.DelRemote(mac); err != nil {
		a.log.Warn("drop remote fdb", "err", err)
	}
	if err := a.plane.PinLocal(mac, c.meta.Name); err != nil {
		a.log.Warn("pin local fdb", "err", err)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.announce(actx, a.endpoint(c), false); err != nil {
		a.log.Warn("announce migrated endpoint", "container", c.meta.Name, "err", err)
	}
	return migration.Switched{NetworkMs: migration.Ms(time.Since(t0))}
}

// adopt records a committed incoming container as this node's own.
func (a *Agent) adopt(c *container) {
	c.meta.Incoming = false
	if err := a.writeMeta(c.meta); err != nil {
		a.log.Warn("record committed container", "container", c.meta.Name, "err", err)
	}
	a.mu.Lock()
	a.containers[c.meta.Name] = c
	a.mu.Unlock()
}

// decideAfterLoss settles a restored service whose source connection
// broke before the commit: the source's own table is the truth. If the
// source no longer has the service it committed, and this node switches;
// otherwise the source rolled back and this copy is destroyed.
func (a *Agent) decideAfterLoss(ctx context.Context, c *container, from string, cause error, committed *bool) error {
	src, ok := a.peers[from]
	if !ok {
		return cause
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		sc, err := src.Get(rctx, c.meta.Name)
		cancel()
		switch {
		case errors.Is(err, api.ErrNotFound):
			*committed = true
			a.adopt(c)
			a.takeTraffic(ctx, c)
			return nil
		case err == nil && sc.Status == "running":
			return fmt.Errorf("source kept the service: %w", cause)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("source unreachable after restore; destination copy dropped: %w", cause)
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgehop/edgehop/internal/blockdiff"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/precopy"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/transfer"
)

// Live rounds stop when a round found at most precopyDelta bytes changed
// (about 30 ms of a 1 Gbit/s link), when the delta stops shrinking by 10%,
// after the requested number of rounds, or at precopyDeadline.
const (
	precopyDelta    = 4 << 20
	precopyShrink   = 0.9
	precopyDeadline = 2 * time.Minute
)

// precopyRounds copies the running container's writable layer, then its
// memory in live rounds, to the destination (the source side of
// pre-copy). The service is never frozen here. It returns the Source for
// the final delta, the layer's state as it was sent, and what the rounds
// did (never nil). sums records the layer's large files as sent.
func (a *Agent) precopyRounds(ctx context.Context, conn *transfer.Conn, name string, rounds int, send transfer.SendOptions, sums *blockdiff.Index) (*precopy.Source, layerSnapshot, *migration.Precopy, error) {
	pc := &migration.Precopy{}
	upper := filepath.Join(a.dir(name), "upper")
	layer, err := snapshotLayer(upper)
	if err != nil {
		return nil, layer, pc, err
	}
	if err := conn.WriteMsg(ctx, migration.MsgLayer, migration.LayerNotice{Bytes: layerBytes(upper)}); err != nil {
		return nil, layer, pc, err
	}
	lopts := send
	lopts.Name, lopts.Overlay, lopts.Live, lopts.Tee = "upper-live", true, true, teeSums(sums)
	lst, err := conn.SendDir(ctx, upper, lopts)
	pc.LayerBytes = lst.WireBytes
	if err != nil {
		return nil, layer, pc, fmt.Errorf("writable layer: %w", err)
	}
	src, pc2, err := a.memoryRounds(ctx, conn, name, rounds, send, pc)
	return src, layer, pc2, err
}

// memoryRounds runs the live memory rounds of precopyRounds.
func (a *Agent) memoryRounds(ctx context.Context, conn *transfer.Conn, name string, rounds int, send transfer.SendOptions, pc *migration.Precopy) (*precopy.Source, *migration.Precopy, error) {
	st, err := a.rt.State(ctx, name)
	if err != nil {
		return nil, pc, err
	}
	if st.Pid <= 0 {
		return nil, pc, fmt.Errorf("%s has no running process (%s)", name, st.Status)
	}
	src, err := precopy.NewSource(precopy.Config{Pid: st.Pid, Send: send, Logger: a.log})
	if err != nil {
		return nil, pc, err
	}
	if rounds == 0 {
		rounds = migration.DefaultRounds
	}
	rule := precopy.StopRule{MaxRounds: rounds, DeltaBytes: precopyDelta, MinShrink: precopyShrink, Deadline: time.Now().Add(precopyDeadline)}
	// Each round waits until the destination stored the one before, and
	// the freeze waits for the last: a freeze must not compete with the
	// destination (and the emulated link) still digesting a round.
	stored := func(ctx context.Context) error { return expect(ctx, conn, migration.MsgStored, nil) }
	hist, why, err := src.Rounds(ctx, conn, rule, func(ctx context.Context, round int) error {
		if round > 1 {
			if err := stored(ctx); err != nil {
				return err
			}
		}
		return conn.WriteMsg(ctx, migration.MsgRound, migration.RoundStart{Round: round})
	})
	if err == nil {
		err = stored(ctx)
	}
	for _, h := range hist {
		pc.Rounds = append(pc.Rounds, migration.Round{Pages: h.Pages, ChangedPages: h.Changed, XorPages: h.XorPages, Bytes: h.Bytes, Ms: migration.Ms(h.Duration)})
	}
	pc.StopReason = string(why)
	if err != nil {
		return nil, pc, err
	}
	a.log.Info("pre-copy rounds done", "container", name, "rounds", len(hist), "stop", why)
	return src, pc, nil
}

// layerLimit bounds pre-copy's live writable layer: twice what the
// source declared (files grow while the layer is sent) plus
// maxStateSlack. The layer holds the service's volumes, so its size is
// unrelated to its memory; a declared size past maxStateSize counts as
// that.
func layerLimit(ln migration.LayerNotice) int64 {
	return 2*min(max(ln.Bytes, 0), maxStateSize) + maxStateSlack
}

// errSourceSilent ends an incoming migration whose source sent nothing
// for Config.SourceSilenceMs before the freeze.
var errSourceSilent = errors.New("the source went silent before the freeze")

// receiveRounds is the destination side of the live rounds: it stores
// each round until the source announces the freeze. store is nil when the
// strategy has no live rounds. live, when set, receives a live writable
// layer (migration.MsgLiveLayer). An abort from the source (it gave up
// before freezing: the service still runs there) ends it with an error
// and nothing to roll back, and so does a source silent for longer than
// Config.SourceSilenceMs between two messages: TCP's keepalive and
// TCP_USER_TIMEOUT find a vanished node or a cut link, not an agent that
// stopped with its connection open (SIGSTOP, a hang), whose kernel still
// acknowledges; without this bound its destination would hold the name,
// the namespace and the reservations forever.
func (a *Agent) receiveRounds(ctx context.Context, conn *transfer.Conn, store *precopy.Store, upper string, live func(context.Context, migration.LiveLayer) error) (migration.FreezeNotice, error) {
	var fz migration.FreezeNotice
	silence := a.cfg.sourceSilence()
	for {
		rctx, cancel := context.WithTimeoutCause(ctx, silence, errSourceSilent)
		typ, body, err := conn.ReadMsg(rctx)
		silent := err != nil && ctx.Err() == nil && errors.Is(context.Cause(rctx), errSourceSilent)
		cancel()
		m := peerMessage{typ, body, err}
		switch {
		case silent:
			return fz, fmt.Errorf("waiting for the freeze: %w for %s", errSourceSilent, silence)
		case err != nil:
			return fz, fmt.Errorf("waiting for the freeze: %w", err)
		case typ == migration.MsgFrozen:
			return fz, m.as(migration.MsgFrozen, &fz)
		case typ == migration.MsgAbort:
			return fz, fmt.Errorf("source gave up before freezing: %w", m.as(migration.MsgFrozen, nil))
		case typ == migration.MsgLiveLayer && live != nil:
			var ll migration.LiveLayer
			if err := m.as(migration.MsgLiveLayer, &ll); err != nil {
				return fz, err
			}
			if err := live(ctx, ll); err != nil {
				return fz, err
			}
		case typ == migration.MsgLayer && store != nil:
			var ln migration.LayerNotice
			if err := m.as(migration.MsgLayer, &ln); err != nil {
				return fz, err
			}
			limit := layerLimit(ln)
			if _, err := conn.RecvDir(ctx, upper, transfer.RecvOptions{MaxBytes: limit}); err != nil {
				return fz, fmt.Errorf("pre-copy of the writable layer (at most %d bytes: twice the %d the source declared, plus %d): %w", limit, ln.Bytes, maxStateSlack, err)
			}
		case typ == migration.MsgRound && store != nil:
			var rs migration.RoundStart
			if err := m.as(migration.MsgRound, &rs); err != nil {
				return fz, err
			}
			if _, err := store.ReceiveRound(ctx, conn); err != nil {
				return fz, fmt.Errorf("pre-copy round %d: %w", rs.Round, err)
			}
			if err := conn.WriteMsg(ctx, migration.MsgStored, rs); err != nil {
				return fz, err
			}
		default:
			return fz, errors.New("protocol: got " + typ + " before the freeze")
		}
	}
}

// checkDumpable refuses, before anything is frozen, a container CRIU
// cannot dump here, and says with which real ids it can be.
//
// CRIU reads every process's rlimits. Without CAP_SYS_RESOURCE the
// kernel allows that only to a caller whose real uid and gid are the
// process's real, effective and saved ids (check_prlimit_permission).
// With the criu shim's gate library (runc.Runtime.ReadsAnyRlimits)
// CRIU reads them from /proc/PID/limits instead, whatever the users.
// Without it, a service whose processes all run as one user and group
// (memcached -u nobody, mosquitto dropping to its own user, PostgreSQL)
// is dumped with runc and CRIU given that real uid and gid (their
// effective ids and capabilities stay root's); a service mixing users
// (a root master with unprivileged workers) cannot be, and is refused
// while it keeps running. nil ids: dump as the agent is.
func (a *Agent) checkDumpable(ctx context.Context, name string, pid int) (*runc.IDs, error) {
	ok, err := linux.HasCapSysResource()
	if err != nil || ok {
		return nil, nil // unknown: let CRIU decide (a failed dump rolls back)
	}
	if pid <= 0 || a.rt.ReadsAnyRlimits(ctx) {
		return nil, nil
	}
	pids, err := linux.ProcessTree(pid)
	if err != nil {
		return nil, nil
	}
	return dumpIDs(name, pids, os.Getuid(), os.Getgid(), func(pid int) ([3]int, [3]int, error) {
		u, err := linux.ProcessUIDs(pid)
		if err != nil {
			return u, [3]int{}, err
		}
		g, err := linux.ProcessGIDs(pid)
		return u, g, err
	})
}

// dumpIDs decides checkDumpable from the processes' ids: nil when every
// process runs as the agent's uid and gid, one uid and gid when they all
// run as that, an ErrInvalid naming the mixture otherwise. Processes
// gone meanwhile are skipped.
func dumpIDs(name string, pids []int, myUID, myGID int, ids func(pid int) (uid, gid [3]int, err error)) (*runc.IDs, error) {
	var (
		common *runc.IDs
		first  int
	)
	for _, pid := range pids {
		u, g, err := ids(pid)
		if err != nil {
			continue
		}
		if u[0] != u[1] || u[1] != u[2] || g[0] != g[1] || g[1] != g[2] {
			return nil, fmt.Errorf("%w: %s has a process (pid %d) whose real, effective and saved ids differ (uid %d/%d/%d, gid %d/%d/%d), and this agent lacks CAP_SYS_RESOURCE, so CRIU cannot read its rlimits (give the agent CAP_SYS_RESOURCE); the service keeps running here",
				ErrInvalid, name, pid, u[0], u[1], u[2], g[0], g[1], g[2])
		}
		this := runc.IDs{UID: u[0], GID: g[0]}
		if common == nil {
			common, first = &this, pid
			continue
		}
		if *common != this {
			return nil, fmt.Errorf("%w: %s runs processes as different users (pid %d as %d:%d, pid %d as %d:%d), and this agent lacks CAP_SYS_RESOURCE, so CRIU cannot dump them all (run the service's processes as one user, or give the agent CAP_SYS_RESOURCE); the service keeps running here",
				ErrInvalid, name, first, common.UID, common.GID, pid, this.UID, this.GID)
		}
	}
	if common == nil || (common.UID == myUID && common.GID == myGID) {
		return nil, nil
	}
	return common, nil
}

// Services smaller than reserveMin get no memory reserve; a reserve is at
// most a quarter of the available memory, and the source waits at most
// reserveWait for its reserve before freezing.
const (
	reserveMin  = 64 << 20
	reserveWait = 15 * time.Second
)

// reserveFor starts touching n bytes for a migration (linux.Reserve);
// nil (a valid, empty reserve) for small services.
func reserveFor(ctx context.Context, n int64) *linux.Reserve {
	if n < reserveMin {
		return nil
	}
	if avail := linux.AvailableMemory(); avail > 0 && n > avail/4 {
		n = avail / 4
	}
	return linux.ReserveMemory(ctx, n)
}

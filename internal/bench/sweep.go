package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/migration"
)

// sweepIP is the podman redis's overlay address, outside every node's range.
const sweepIP = "10.200.250.11"

// sweep migrates a redis holding each configured amount of data once per
// path: edgehop stop-and-copy, edgehop post-copy and podman (pm is nil
// with perr saying why when podman cannot run).
func (e *env) sweep(ctx context.Context, pm *podman, perr error) ([]SweepRow, error) {
	// podman's storage is host-global: its destination never unpacks the
	// image. Unpack it on both of edgehop's nodes before measuring, so
	// neither path pays for the image inside a migration.
	for i := range e.st.Nodes {
		if err := e.warm(ctx, i, image.Services); err != nil {
			return nil, err
		}
	}
	var rows []SweepRow
	for _, size := range e.cfg.SizesMB {
		e.log.Info("sweep", "size_mb", size, "path", "edgehop")
		rs, err := e.sweepEdgehop(ctx, size)
		if err != nil {
			return rows, err
		}
		rows = append(rows, rs...)
		e.log.Info("sweep", "size_mb", size, "path", "podman")
		if pm == nil {
			rows = append(rows, SweepRow{SizeMB: size, Path: "podman checkpoint/restore", Reason: perr.Error()})
			continue
		}
		row, err := pm.sweepOne(ctx, size)
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
		if err != nil {
			row.Error = err.Error()
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// sweepEdgehop runs redis under edgehop, fills it, migrates it node0 →
// node1 with stop-and-copy and back with post-copy.
func (e *env) sweepEdgehop(ctx context.Context, size int) (rows []SweepRow, err error) {
	const name = "redis"
	loc := e.node(nodeA).Name
	c, err := e.agents[loc].Run(ctx, api.RunRequest{Name: name, Image: image.Services, Args: redisArgs()})
	if err != nil {
		return nil, fmt.Errorf("run redis: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := e.agents[loc].Remove(rctx, name); rerr != nil && !errors.Is(rerr, api.ErrNotFound) {
			err = errors.Join(err, fmt.Errorf("remove redis: %w", rerr))
		}
	}()
	addr := net.JoinHostPort(c.IP, redisPort)
	if err := waitListening(ctx, e.client, addr, 30*time.Second); err != nil {
		return nil, err
	}
	rc, err := dialRedis(ctx, e.client, addr)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	keys, used, err := rc.fill(ctx, int64(size)*1e6, redisValue)
	if err != nil {
		return nil, err
	}
	for _, st := range []migration.Strategy{migration.StopAndCopy, migration.PostCopy} {
		to := e.other(loc)
		row := SweepRow{SizeMB: size, Path: "edgehop " + string(st), Available: true, Keys: keys, RedisUsedBytes: used}
		var res migration.Result
		merr := e.agents[loc].Migrate(ctx, name, api.MigrateRequest{To: to, Strategy: string(st), LinkBps: int64(e.st.PathRate(loc, to))}, &res)
		switch {
		case ctx.Err() != nil:
			return rows, ctx.Err()
		case errors.Is(merr, api.ErrInvalid):
			row.Available, row.Reason = false, merr.Error()
			rows = append(rows, row)
			continue
		case merr != nil:
			return rows, fmt.Errorf("migrate redis (%d MB, %s): %w", size, st, merr)
		}
		row.OK, row.Error = res.OK, res.Error
		row.DowntimeMs, row.TotalMs, row.PhasesMs = res.DowntimeMs, res.TotalMs, res.PhasesMs
		row.StateBytes, row.BytesOnWire = res.StateBytes, res.BytesOnWire
		if res.OK {
			loc = to
		} else if !res.RolledBack {
			rows = append(rows, row)
			return rows, fmt.Errorf("redis (%d MB) lost in a failed %s migration: %s", size, st, res.Error)
		}
		if aerr := rc.alive(keys); aerr == nil {
			row.ConnectionKept = true
		} else {
			row.Error = errors.Join(errorOrNil(row.Error), fmt.Errorf("client connection after migration: %w", aerr)).Error()
			// The next migration needs a working client to check.
			rc.Close()
			if rc, err = dialRedis(ctx, e.client, addr); err != nil {
				return append(rows, row), err
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// warm makes node i unpack image img by running and removing a container
// of it.
func (e *env) warm(ctx context.Context, i int, img string) error {
	const name = "warm"
	c := e.agents[e.node(i).Name]
	if _, err := c.Run(ctx, api.RunRequest{Name: name, Image: img, Args: []string{"true"}}); err != nil {
		return fmt.Errorf("unpack image %s on %s: %w", img, e.node(i).Name, err)
	}
	if err := c.Remove(ctx, name); err != nil {
		return fmt.Errorf("unpack image %s on %s: %w", img, e.node(i).Name, err)
	}
	return nil
}

func errorOrNil(s string) error {
	if s == "" {
		return nil
	}
	return errors.New(s)
}

// sweepOne runs redis in a podman container on node0, fills it and
// migrates it to node1 with podman checkpoint/restore.
func (p *podman) sweepOne(ctx context.Context, size int) (row SweepRow, err error) {
	row = SweepRow{SizeMB: size, Path: p.path(), Available: true}
	s, err := p.newService(ctx, "redis", image.Services, netip.MustParseAddr(sweepIP), redisArgs(), nodeA)
	if err != nil {
		return row, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := p.remove(rctx, s); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove podman redis: %w", rerr))
		}
	}()
	if err := p.start(ctx, s); err != nil {
		return row, err
	}
	addr := net.JoinHostPort(sweepIP, redisPort)
	if err := waitListening(ctx, p.e.client, addr, 30*time.Second); err != nil {
		return row, err
	}
	rc, err := dialRedis(ctx, p.e.client, addr)
	if err != nil {
		return row, err
	}
	defer rc.Close()
	if row.Keys, row.RedisUsedBytes, err = rc.fill(ctx, int64(size)*1e6, redisValue); err != nil {
		return row, err
	}
	r, err := p.migrate(ctx, s, nodeB)
	row.OK, row.DowntimeMs, row.TotalMs, row.PhasesMs = r.OK, r.DowntimeMs, r.TotalMs, r.PhasesMs
	row.StateBytes, row.BytesOnWire = r.BytesOnWire, r.BytesOnWire
	if err != nil {
		return row, err
	}
	if aerr := rc.alive(row.Keys); aerr != nil {
		return row, fmt.Errorf("client connection after migration: %w", aerr)
	}
	row.ConnectionKept = true
	return row, nil
}

package world

import (
	"context"
	"errors"
	"fmt"
	"github.com/edgehop/edgehop/internal/api"
	"math"
	"time"

	"github.com/edgehop/edgehop/internal/controller"
	"github.com/edgehop/edgehop/internal/mobility"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/topo"
)

// Model maps distances to link parameters.
type Model struct {
	// NodeBase + NodePer100m × d is a node link's one-way delay when the
	// user is d metres from the node.
	NodeBase    time.Duration
	NodePer100m time.Duration
	// AccessBase + AccessPer100m × d is the access link's one-way delay
	// at d metres from the AP; its rate falls linearly from AccessRate at
	// the AP to AccessRate/4 at AccessRange and beyond.
	AccessBase    time.Duration
	AccessPer100m time.Duration
	AccessRate    uint64
	AccessRange   float64
	NodeRate      uint64
}

// DefaultModel: nodes 0.2 ms + 1 ms per 100 m one way (H-Container's
// +1 ms per step), access 0.2 ms + 0.5 ms per 100 m at 200 Mbit/s falling
// to 50 Mbit/s at 300 m, node links 1 Gbit/s.
func DefaultModel() Model {
	return Model{NodeBase: 200 * time.Microsecond, NodePer100m: time.Millisecond, AccessBase: 200 * time.Microsecond,
		AccessPer100m: 500 * time.Microsecond, AccessRate: 200_000_000, AccessRange: 300, NodeRate: 1_000_000_000}
}

// NodeLink is a node's link with the user d metres away.
func (m Model) NodeLink(d float64) testbed.Link {
	return testbed.Link{RateBps: m.NodeRate, Delay: m.NodeBase + time.Duration(d/100*float64(m.NodePer100m))}
}

// AccessLink is the access link at d metres from the AP.
func (m Model) AccessLink(d float64) testbed.Link {
	f := math.Max(0.25, 1-0.75*d/m.AccessRange)
	return testbed.Link{RateBps: uint64(float64(m.AccessRate) * f), Delay: m.AccessBase + time.Duration(d/100*float64(m.AccessPer100m))}
}

// Config describes a run.
type Config struct {
	Root, Testbed string
	Plane         topo.Topology
	Model         Model
	// Users maps a user (a client of the testbed) to its trace.
	Users map[string]mobility.Trace
	// Controller receives the users' positions; nil: none (the links
	// still follow).
	Controller *controller.Client
	Tick       time.Duration
	// OnTick, when set, is called after every tick with the elapsed time
	// and the positions.
	OnTick func(elapsed time.Duration, pos map[string]topo.Point)
}

// controllerGrace is how long the controller may stay unreachable.
const controllerGrace = 30 * time.Second

// Run replays the traces in real time until the longest ends or ctx ends.
// With more than one user, each node's link follows the first user (the
// emulation places one user per testbed at distance).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Tick <= 0 {
		cfg.Tick = 500 * time.Millisecond
	}
	if len(cfg.Users) == 0 {
		return errors.New("world: no users")
	}
	var dur time.Duration
	var lead string
	for u, tr := range cfg.Users {
		if err := tr.Validate(); err != nil {
			return fmt.Errorf("world: trace of %s: %w", u, err)
		}
		dur = max(dur, tr.Duration())
		if lead == "" || u < lead {
			lead = u
		}
	}
	idx := topo.NewIndex(cfg.Plane)
	start := time.Now()
	// A controller that restarts is unreachable for a moment: the users
	// go on walking (their links follow), and only a controller gone for
	// longer than controllerGrace ends the run.
	var unreachableSince time.Time
	t := time.NewTicker(cfg.Tick)
	defer t.Stop()
	for {
		el := time.Since(start)
		pos := map[string]topo.Point{}
		for u, tr := range cfg.Users {
			pos[u] = tr.Position(el)
			if cfg.Controller != nil {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := cfg.Controller.Move(rctx, u, pos[u])
				cancel()
				switch {
				case err == nil:
					unreachableSince = time.Time{}
				case ctx.Err() != nil:
				case errors.Is(err, api.ErrUnavailable) && unreachableSince.IsZero():
					unreachableSince = time.Now()
				case errors.Is(err, api.ErrUnavailable) && time.Since(unreachableSince) < controllerGrace:
				default:
					return fmt.Errorf("world: report %s's position: %w", u, err)
				}
			}
		}
		if err := follow(ctx, cfg, idx, pos, lead); err != nil {
			return err
		}
		if cfg.OnTick != nil {
			cfg.OnTick(el, pos)
		}
		if el >= dur {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Place sets every link for users at pos, once (before a walk starts,
// so that the first measurements already reflect the distances).
func Place(ctx context.Context, cfg Config, pos map[string]topo.Point) error {
	lead := ""
	for u := range pos {
		if lead == "" || u < lead {
			lead = u
		}
	}
	return follow(ctx, cfg, topo.NewIndex(cfg.Plane), pos, lead)
}

// follow sets the links from the positions.
func follow(ctx context.Context, cfg Config, idx *topo.Index, pos map[string]topo.Point, lead string) error {
	st, err := testbed.Load(cfg.Root, cfg.Testbed)
	if err != nil {
		return err
	}
	for _, c := range st.Clients {
		p, ok := pos[c.Name]
		if !ok || c.AP == "" {
			continue
		}
		a, ok := idx.AP(c.AP)
		if !ok {
			continue
		}
		if err := testbed.SetLink(ctx, cfg.Root, cfg.Testbed, c.Name, cfg.Model.AccessLink(topo.Dist(a.Pos, p))); err != nil {
			return fmt.Errorf("world: access link of %s: %w", c.Name, err)
		}
	}
	p := pos[lead]
	for _, n := range st.Nodes {
		pn, ok := idx.Node(n.Name)
		if !ok {
			continue
		}
		if err := testbed.SetLink(ctx, cfg.Root, cfg.Testbed, n.Name, cfg.Model.NodeLink(topo.Dist(pn.Pos, p))); err != nil {
			return fmt.Errorf("world: link of %s: %w", n.Name, err)
		}
	}
	return nil
}

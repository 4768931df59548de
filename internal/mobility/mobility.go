package mobility

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/edgehop/edgehop/internal/topo"
)

// Waypoint is where a trace goes next, how fast (metres per second) it
// walks there, and how long it stays once there.
type Waypoint struct {
	Pos   topo.Point    `json:"pos"`
	Speed float64       `json:"speed_mps"`
	Pause time.Duration `json:"pause_ns,omitempty"`
}

// Trace is a user's movement: a start and waypoints walked in order.
type Trace struct {
	Start     topo.Point `json:"start"`
	Waypoints []Waypoint `json:"waypoints"`
}

// Validate checks speeds and positions.
func (t Trace) Validate() error {
	var errs []error
	for i, w := range t.Waypoints {
		if !(w.Speed > 0) || math.IsInf(w.Speed, 0) {
			errs = append(errs, fmt.Errorf("waypoint %d: speed %v m/s must be positive", i, w.Speed))
		}
		if w.Pause < 0 {
			errs = append(errs, fmt.Errorf("waypoint %d: negative pause", i))
		}
	}
	return errors.Join(errs...)
}

// Duration is how long the whole trace takes.
func (t Trace) Duration() time.Duration {
	var d time.Duration
	p := t.Start
	for _, w := range t.Waypoints {
		d += legTime(p, w) + w.Pause
		p = w.Pos
	}
	return d
}

// Length is how far the whole trace walks, in metres.
func (t Trace) Length() float64 {
	var l float64
	p := t.Start
	for _, w := range t.Waypoints {
		l += topo.Dist(p, w.Pos)
		p = w.Pos
	}
	return l
}

func legTime(from topo.Point, w Waypoint) time.Duration {
	return time.Duration(topo.Dist(from, w.Pos) / w.Speed * float64(time.Second))
}

// Position is where the trace is at elapsed time e (the last waypoint
// once it ended, the start before it began).
func (t Trace) Position(e time.Duration) topo.Point {
	p := t.Start
	if e <= 0 {
		return p
	}
	for _, w := range t.Waypoints {
		leg := legTime(p, w)
		if e < leg {
			f := float64(e) / float64(leg)
			return topo.Point{X: p.X + f*(w.Pos.X-p.X), Y: p.Y + f*(w.Pos.Y-p.Y)}
		}
		e -= leg
		p = w.Pos
		if e < w.Pause {
			return p
		}
		e -= w.Pause
	}
	return p
}

// Walk is a straight trace from a to b at speed.
func Walk(a, b topo.Point, speed float64) Trace {
	return Trace{Start: a, Waypoints: []Waypoint{{Pos: b, Speed: speed}}}
}

// RandomWaypoint is the random-waypoint model inside the rectangle
// [min, max]: n legs to uniformly drawn points at speeds uniform in
// [vmin, vmax], each followed by a pause uniform in [0, pmax]. The same
// seed gives the same trace.
func RandomWaypoint(seed uint64, start, min, max topo.Point, n int, vmin, vmax float64, pmax time.Duration) Trace {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t := Trace{Start: start}
	for i := 0; i < n; i++ {
		w := Waypoint{
			Pos:   topo.Point{X: min.X + r.Float64()*(max.X-min.X), Y: min.Y + r.Float64()*(max.Y-min.Y)},
			Speed: vmin + r.Float64()*(vmax-vmin),
		}
		if pmax > 0 {
			w.Pause = time.Duration(r.Int64N(int64(pmax)))
		}
		t.Waypoints = append(t.Waypoints, w)
	}
	return t
}

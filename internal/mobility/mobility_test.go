package mobility

import (
	"math"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/topo"
)

func near(a, b topo.Point) bool { return math.Abs(a.X-b.X) < 1e-6 && math.Abs(a.Y-b.Y) < 1e-6 }

func TestTracePosition(t *testing.T) {
	tr := Trace{Start: topo.Point{}, Waypoints: []Waypoint{
		{Pos: topo.Point{X: 100}, Speed: 10, Pause: 5 * time.Second},
		{Pos: topo.Point{X: 100, Y: 50}, Speed: 5},
	}}
	if err := tr.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := tr.Duration(); got != 25*time.Second {
		t.Errorf("Duration = %v, want 25s (10 s walk, 5 s pause, 10 s walk)", got)
	}
	for _, tc := range []struct {
		e    time.Duration
		want topo.Point
	}{
		{-time.Second, topo.Point{}}, {5 * time.Second, topo.Point{X: 50}}, {12 * time.Second, topo.Point{X: 100}},
		{20 * time.Second, topo.Point{X: 100, Y: 25}}, {time.Hour, topo.Point{X: 100, Y: 50}},
	} {
		if got := tr.Position(tc.e); !near(got, tc.want) {
			t.Errorf("Position(%v) = %v, want %v", tc.e, got, tc.want)
		}
	}
	if (Trace{Waypoints: []Waypoint{{Speed: 0}}}).Validate() == nil {
		t.Error("a zero speed accepted")
	}
}

func TestRandomWaypoint(t *testing.T) {
	a := RandomWaypoint(7, topo.Point{}, topo.Point{}, topo.Point{X: 900, Y: 100}, 20, 1, 3, 2*time.Second)
	b := RandomWaypoint(7, topo.Point{}, topo.Point{}, topo.Point{X: 900, Y: 100}, 20, 1, 3, 2*time.Second)
	if len(a.Waypoints) != 20 || a.Duration() != b.Duration() {
		t.Fatal("same seed, different traces")
	}
	for _, w := range a.Waypoints {
		if w.Pos.X < 0 || w.Pos.X > 900 || w.Pos.Y < 0 || w.Pos.Y > 100 || w.Speed < 1 || w.Speed > 3 || w.Pause >= 2*time.Second {
			t.Fatalf("waypoint out of bounds: %+v", w)
		}
	}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestTraceLength(t *testing.T) {
	tr := Trace{Start: topo.Point{X: 0}, Waypoints: []Waypoint{{Pos: topo.Point{X: 3, Y: 4}, Speed: 1}, {Pos: topo.Point{X: 3, Y: 10}, Speed: 2}}}
	if l := tr.Length(); l != 11 {
		t.Errorf("length %v, want 11", l)
	}
	if l := (Trace{}).Length(); l != 0 {
		t.Errorf("empty trace: %v", l)
	}
}

package topo

import (
	"math"
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	tp := Line(3, 2, 300)
	if err := tp.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(tp.APs) != 6 || len(tp.Nodes) != 3 || len(tp.Links) != 2 {
		t.Fatalf("line: %d APs, %d nodes, %d links", len(tp.APs), len(tp.Nodes), len(tp.Links))
	}
	if got := tp.NearestAP(Point{X: 310}); got != "ap2" {
		t.Errorf("nearest AP at x=310: %s, want ap2", got)
	}
	if got := tp.NodesByDistance(Point{X: 890})[0].Name; got != "node2" {
		t.Errorf("nearest node at x=890: %s", got)
	}
	for _, tc := range []struct {
		a, b string
		want int
	}{{"region0", "region0", 0}, {"region0", "region1", 1}, {"region0", "region2", 2}, {"region0", "nowhere", -1}} {
		if got := tp.RegionHops(tc.a, tc.b); got != tc.want {
			t.Errorf("hops %s-%s = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	if d := Dist(Point{0, 0}, Point{3, 4}); d != 5 {
		t.Errorf("Dist = %v", d)
	}
}

func TestValidate(t *testing.T) {
	tp := Line(2, 1, 100)
	tp.APs = append(tp.APs, AP{Name: "node0", Region: "region0"}, AP{Name: "x", Region: "mars", Pos: Point{X: math.NaN()}})
	tp.Links = append(tp.Links, Link{A: "region0", B: "region0"})
	err := tp.Validate()
	for _, want := range []string{"has the name of", "unknown region", "position", "two different"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}

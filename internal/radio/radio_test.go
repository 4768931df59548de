package radio

import (
	"math"
	"testing"

	"github.com/edgehop/edgehop/internal/topo"
)

func TestRSSI(t *testing.T) {
	m := DefaultModel()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	// 20 dBm - 40 dB - 30 log10(100) = -80 dBm.
	if got := m.RSSI(100); math.Abs(got+80) > 1e-9 {
		t.Errorf("RSSI(100 m) = %v, want -80", got)
	}
	if m.RSSI(0.1) != m.RSSI(1) {
		t.Error("distances under 1 m must count as 1 m")
	}
}

// A device walking along the line is handed from AP to AP, once each, in
// order; walking back and forth around a border does not bounce it.
func TestDecideWalk(t *testing.T) {
	tp := topo.Line(3, 2, 300)
	m := DefaultModel()
	serving := ""
	var path []string
	for x := 0.0; x <= 900; x += 5 {
		d := m.Decide(tp, serving, topo.Point{X: x})
		if d.Handoff {
			serving = d.To
			path = append(path, serving)
		}
	}
	want := []string{"ap0", "ap1", "ap2", "ap3", "ap4", "ap5"}
	if len(path) != len(want) {
		t.Fatalf("handoffs %v, want %v", path, want)
	}
	for i := range want {
		if path[i] != want[i] {
			t.Fatalf("handoffs %v, want %v", path, want)
		}
	}
	// On the ap0/ap1 border (x=75), wandering ±20 m keeps the device on
	// whichever AP it has.
	serving = "ap0"
	n := 0
	for i := 0; i < 200; i++ {
		x := 75 + 20*math.Sin(float64(i)/3)
		if d := m.Decide(tp, serving, topo.Point{X: x}); d.Handoff {
			serving = d.To
			n++
		}
	}
	if n > 1 {
		t.Errorf("%d handoffs wandering on a border, want at most 1", n)
	}
}

func TestDecideNothingHeard(t *testing.T) {
	tp := topo.Line(1, 1, 100)
	if d := DefaultModel().Decide(tp, "ap0", topo.Point{X: 10000}); d.Handoff || d.Reason == "" {
		t.Errorf("far away: %+v", d)
	}
}

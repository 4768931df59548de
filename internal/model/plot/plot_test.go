package plot

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"
)

// wellFormed parses the SVG and counts its elements by name.
func wellFormed(t *testing.T, svg []byte) map[string]int {
	t.Helper()
	counts := map[string]int{}
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return counts
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
}

func TestFigureSVG(t *testing.T) {
	f := Figure{Title: "a < b & c", Panels: []Panel{
		{Title: "linear", XLabel: "x", YLabel: "y", Series: []Series{
			{Name: "line", X: []float64{0, 1, 2}, Y: []float64{0, 10, 20}, Line: true},
			{Name: "points", X: []float64{0.5, 1.5}, Y: []float64{4, 16}, Markers: true},
		}},
		{Title: "log", LogX: true, LogY: true, Series: []Series{
			// Non-positive and NaN values cannot go on a log axis: skipped.
			{Name: "curve", X: []float64{1, 10, 100, 0}, Y: []float64{5, 50, 5000, math.NaN()}, Line: true, Dashed: true, Color: "#123456"},
		}},
	}}
	svg := f.SVG()
	c := wellFormed(t, svg)
	if c["svg"] != 1 || c["polyline"] != 2 || c["g"] != 2 {
		t.Errorf("elements %v", c)
	}
	s := string(svg)
	for _, want := range []string{"a &lt; b &amp; c", "stroke-dasharray", "#123456", ">line<", ">points<", ">1000<", ">10000<"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(s, "NaN") || strings.Contains(s, "Inf") {
		t.Errorf("SVG contains NaN/Inf coordinates")
	}
	// Deterministic output.
	if !bytes.Equal(svg, f.SVG()) {
		t.Errorf("SVG differs between two renders")
	}
}

func TestAxis(t *testing.T) {
	a := newAxis([]float64{3, 97}, false, 0, 100)
	if a.lo != 0 || a.hi != 100 {
		t.Errorf("linear axis [%g, %g], want [0, 100]", a.lo, a.hi)
	}
	if got := a.pos(50); got != 50 {
		t.Errorf("pos(50) = %g", got)
	}
	l := newAxis([]float64{2, 300}, true, 0, 300)
	if l.lo != 0 || l.hi != 3 || len(l.ticks()) != 4 {
		t.Errorf("log axis [%g, %g] ticks %v", l.lo, l.hi, l.ticks())
	}
	empty := newAxis(nil, false, 0, 1)
	if empty.hi <= empty.lo {
		t.Errorf("empty axis degenerate")
	}
}

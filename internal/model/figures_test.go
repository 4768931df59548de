package model

import (
	"bytes"
	"encoding/xml"
	"io"
	"testing"

	"github.com/edgehop/edgehop/internal/model/plot"
)

func series(t *testing.T, p plot.Panel, name string) plot.Series {
	t.Helper()
	for _, s := range p.Series {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("panel %q has no series %q", p.Title, name)
	return plot.Series{}
}

func parses(t *testing.T, svg []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	for {
		if _, err := dec.Token(); err == io.EOF {
			return
		} else if err != nil {
			t.Fatalf("SVG: %v", err)
		}
	}
}

// TestFig13Shape checks what Sec. VII-B reads off Fig. 13: PAM predicts
// longer KPIs than SotA because SotA ignores processing, and "the larger L,
// the more significant the processing contribution to the downtime,
// resulting in a gap with respect to the SotA model that increases very
// evidently with L".
func TestFig13Shape(t *testing.T) {
	fig := Fig13(DefaultParams())
	parses(t, fig.SVG())
	down := fig.Panels[1]
	const at = 15 // M = 10^(6+15/10) ≈ 31.6 MB
	prevRatio := 0.0
	for _, l := range []string{"100 Mbit/s", "1 Gbit/s", "10 Gbit/s"} {
		pam, sota := series(t, down, "PAM L="+l), series(t, down, "SotA L="+l)
		for i := range pam.Y {
			if pam.Y[i] <= sota.Y[i] {
				t.Errorf("L=%s M=%.1f MB: PAM %.3f s ≤ SotA %.3f s", l, pam.X[i], pam.Y[i], sota.Y[i])
			}
		}
		ratio := pam.Y[at] / sota.Y[at]
		if ratio <= prevRatio {
			t.Errorf("L=%s: PAM/SotA = %.2f does not grow with L (previous %.2f)", l, ratio, prevRatio)
		}
		prevRatio = ratio
	}
	// "dirtiness has a noticeable impact for large values of M, while, for
	// lower M, the KPIs are practically independent of the dirty page rate."
	mig := fig.Panels[0]
	lo, hi := series(t, mig, "PAM R_min"), series(t, mig, "PAM R_max")
	first, last := hi.Y[0]/lo.Y[0], hi.Y[len(hi.Y)-1]/lo.Y[len(lo.Y)-1]
	if !(first < 1.5 && last > 2) {
		t.Errorf("R_max/R_min migration time: %.2f at 1 MB, %.2f at 1 GB", first, last)
	}
}

// TestSamplesFigure draws synthetic measurements against their fitted
// model: one predicted line and one measured series per group and panel.
func TestSamplesFigure(t *testing.T) {
	samples := synthSamples(machine(), "a->b", []Strategy{StopAndCopy, PostCopy}, 0.02, 9)
	res, err := Fit(samples)
	if err != nil {
		t.Fatal(err)
	}
	fig, err := SamplesFigure(func(s Strategy) (Params, error) { return res.Lookup("a->b", s) }, samples)
	if err != nil {
		t.Fatal(err)
	}
	parses(t, fig.SVG())
	if len(fig.Panels) != 3 {
		t.Fatalf("%d panels", len(fig.Panels))
	}
	groups := map[string]bool{}
	for _, s := range samples {
		groups[s.Strategy+" "+FormatBandwidth(s.BandwidthBps)] = true
	}
	for _, p := range fig.Panels[:2] {
		if len(p.Series) != 2*len(groups) {
			t.Errorf("panel %q: %d series, want a model line and measurements per group (%d)", p.Title, len(p.Series), 2*len(groups))
		}
	}
	// The model series follows the measured one it is paired with.
	for i := 0; i < len(fig.Panels[0].Series); i += 2 {
		model, measured := fig.Panels[0].Series[i], fig.Panels[0].Series[i+1]
		if !groups[model.Name] || measured.Name != "" || model.Color != measured.Color {
			t.Fatalf("series %d: %q / %q", i, model.Name, measured.Name)
		}
		for j := range measured.Y {
			if r := model.Y[j] / measured.Y[j]; r < 0.9 || r > 1.1 {
				t.Errorf("%s: model/measured downtime %.3f at %.0f MB", model.Name, r, measured.X[j])
			}
		}
	}
	if last := fig.Panels[2].Series[len(fig.Panels[2].Series)-1]; last.Name != "model = measured" {
		t.Errorf("scatter lacks the identity line")
	}
}

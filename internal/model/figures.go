package model

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/edgehop/edgehop/internal/model/plot"
)

// logSpace returns n values from lo to hi, evenly spaced on a log scale.
func logSpace(lo, hi float64, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = lo * math.Pow(hi/lo, float64(i)/float64(n-1))
	}
	return v
}

// Fig13 draws the shape of PAM's Fig. 13 from a parameter set: (a) the COAT
// migration duration (eq. 32) against the state size for I = 2 dump
// iterations at L = 1 Gbit/s, at R_min and R_max, next to the SotA
// baseline; (b) the COAT downtime (eq. 31) for L = 100 Mbit/s, 1 and
// 10 Gbit/s at R_max, next to SotA. The paper's measured points are not
// available; measured edgehop samples go in SamplesFigure.
func Fig13(p Params) plot.Figure {
	ms := logSpace(1e6, 1e9, 31)
	const iter = 2
	curve := func(f func(m float64) float64) []float64 {
		y := make([]float64, len(ms))
		for i, m := range ms {
			y[i] = f(m) / 1000
		}
		return y
	}
	sota := func(m, rate, l float64) SotAResult {
		return SotA{StateBytes: m, DirtyRate: rate, PageBytes: p.PageBytes, BandwidthBps: l, Iterations: iter}.Predict()
	}
	xMB := make([]float64, len(ms))
	for i, m := range ms {
		xMB[i] = m / 1e6
	}
	a := plot.Panel{Title: fmt.Sprintf("(a) migration duration, I = %d, L = 1 Gbit/s", iter), XLabel: "state size M (MB)", YLabel: "T^mig (s)", LogX: true, LogY: true}
	for _, r := range []struct {
		name string
		r    float64
	}{{"R_min", 0}, {"R_max", 1}} {
		a.Series = append(a.Series, plot.Series{Name: "PAM " + r.name, X: xMB, Line: true,
			Y: curve(func(m float64) float64 { return p.COATMigrationMs(m, r.r, 1e9, iter) })})
		a.Series = append(a.Series, plot.Series{Name: "SotA " + r.name, X: xMB, Line: true, Dashed: true,
			Y: curve(func(m float64) float64 {
				return sota(m, p.MinDirtyRate()+r.r*(p.MaxDirtyRate(m)-p.MinDirtyRate()), 1e9).TotalMs
			})})
	}
	b := plot.Panel{Title: "(b) downtime at R_max", XLabel: "state size M (MB)", YLabel: "T^down (s)", LogX: true, LogY: true}
	for _, l := range []float64{1e8, 1e9, 1e10} {
		b.Series = append(b.Series, plot.Series{Name: "PAM L=" + FormatBandwidth(l), X: xMB, Line: true,
			Y: curve(func(m float64) float64 { return p.COATDowntimeMs(m, 1, l) })})
		b.Series = append(b.Series, plot.Series{Name: "SotA L=" + FormatBandwidth(l), X: xMB, Line: true, Dashed: true,
			Y: curve(func(m float64) float64 { return sota(m, p.MaxDirtyRate(m), l).DowntimeMs })})
	}
	return plot.Figure{Title: "PAM (COAT, eqs. 31–32) vs SotA, parameters " + p.Name, Panels: []plot.Panel{a, b}}
}

// UAVPoint is the bandwidth eq. 37 requires at one UAV speed.
type UAVPoint struct {
	SpeedMps float64 `json:"speed_mps"`
	// RequiredBps is the required bandwidth; absent when Feasible is false.
	RequiredBps float64 `json:"required_bps,omitempty"`
	Feasible    bool    `json:"feasible"`
}

// UAVCurve evaluates eq. 37 at each speed. Speeds at which braking and
// processing alone exceed D*_s are reported infeasible.
func UAVCurve(p Params, u UAV, speeds []float64) ([]UAVPoint, error) {
	pts := make([]UAVPoint, 0, len(speeds))
	for _, v := range speeds {
		l, err := u.RequiredBandwidth(p, v)
		switch {
		case errors.Is(err, ErrInfeasible):
			pts = append(pts, UAVPoint{SpeedMps: v})
		case err != nil:
			return nil, err
		default:
			pts = append(pts, UAVPoint{SpeedMps: v, RequiredBps: l, Feasible: true})
		}
	}
	return pts, nil
}

// UAVVariant is one curve of Fig. 18: Table IV with one parameter changed.
type UAVVariant struct {
	Panel  string     `json:"panel"` // "a" normalized rate, "b" video latency, "c" mass
	Label  string     `json:"label"`
	UAV    UAV        `json:"uav"`
	Points []UAVPoint `json:"points"`
}

// Fig18Speeds are the UAV speeds Fig18 evaluates, 0.5 to 10 m/s.
func Fig18Speeds() []float64 {
	var v []float64
	for s := 0.5; s <= 10+1e-9; s += 0.25 {
		v = append(v, s)
	}
	return v
}

// Fig18 evaluates eq. 37 as PAM's Fig. 18 does: required bandwidth against
// the maximum UAV speed, from Table IV with (a) the normalized dirty rate
// r ∈ {0, 0.25, 0.5, 0.75, 1}, (b) the video latency T^v ∈ {30, 100, 300} ms
// (the range the paper cites) and (c) the mass m_UAV ∈ {1, 3, 5} kg varied.
func Fig18(p Params, base UAV) ([]UAVVariant, plot.Figure, error) {
	var vs []UAVVariant
	add := func(panel, label string, u UAV) error {
		pts, err := UAVCurve(p, u, Fig18Speeds())
		if err != nil {
			return err
		}
		vs = append(vs, UAVVariant{Panel: panel, Label: label, UAV: u, Points: pts})
		return nil
	}
	for _, r := range []float64{0, 0.25, 0.5, 0.75, 1} {
		u := base
		u.NormalizedRate = r
		if err := add("a", fmt.Sprintf("r = %g", r), u); err != nil {
			return nil, plot.Figure{}, err
		}
	}
	for _, tv := range []float64{30, 100, 300} {
		u := base
		u.VideoLatencyMs = tv
		if err := add("b", fmt.Sprintf("T^v = %g ms", tv), u); err != nil {
			return nil, plot.Figure{}, err
		}
	}
	for _, m := range []float64{1, 3, 5} {
		u := base
		u.MassKg = m
		if err := add("c", fmt.Sprintf("m_UAV = %g kg", m), u); err != nil {
			return nil, plot.Figure{}, err
		}
	}
	titles := map[string]string{"a": "(a) normalized dirty rate", "b": "(b) video latency", "c": "(c) UAV mass"}
	var panels []plot.Panel
	for _, name := range []string{"a", "b", "c"} {
		pn := plot.Panel{Title: titles[name], XLabel: "max UAV speed v (m/s)", YLabel: "required L (Mbit/s)", LogY: true}
		for _, v := range vs {
			if v.Panel != name {
				continue
			}
			var s plot.Series
			s.Name, s.Line = v.Label, true
			for _, pt := range v.Points {
				if pt.Feasible {
					s.X = append(s.X, pt.SpeedMps)
					s.Y = append(s.Y, pt.RequiredBps/1e6)
				}
			}
			pn.Series = append(pn.Series, s)
		}
		panels = append(panels, pn)
	}
	return vs, plot.Figure{Title: "Required bandwidth for safe UAV control (eq. 37, Table IV), parameters " + p.Name, Panels: panels}, nil
}

// SamplesFigure draws edgehop's measurements against the model, like
// PAM's Fig. 13: (a) downtime and (b) total time against the state size,
// one colour per strategy and bandwidth, crosses for the measurements and a
// line through the model's prediction for each sample's own inputs (its
// dirty rate, rounds, RTT and compression); (c) predicted against measured
// for every sample, with the identity line. params returns the set to
// predict a strategy with.
func SamplesFigure(params func(Strategy) (Params, error), samples []Sample) (plot.Figure, error) {
	type key struct {
		s string
		l float64
	}
	groups := map[key][]Sample{}
	var keys []key
	for _, s := range samples {
		k := key{s.Strategy, s.BandwidthBps}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], s)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].s != keys[j].s {
			return keys[i].s < keys[j].s
		}
		return keys[i].l < keys[j].l
	})
	down := plot.Panel{Title: "(a) downtime", XLabel: "state size M (MB)", YLabel: "downtime (ms)", LogX: true, LogY: true}
	total := plot.Panel{Title: "(b) total migration time", XLabel: "state size M (MB)", YLabel: "total (ms)", LogX: true, LogY: true}
	scatter := plot.Panel{Title: "(c) model vs measured", XLabel: "measured (ms)", YLabel: "model (ms)", LogX: true, LogY: true}
	lo, hi := math.Inf(1), 0.0
	for gi, k := range keys {
		g := groups[k]
		sort.SliceStable(g, func(i, j int) bool { return g[i].StateBytes < g[j].StateBytes })
		p, err := params(Strategy(k.s))
		if err != nil {
			return plot.Figure{}, err
		}
		color := plot.Color(gi)
		name := fmt.Sprintf("%s %s", k.s, FormatBandwidth(k.l))
		var x, md, mt, pd, pt []float64
		for _, s := range g {
			pr, err := p.Predict(Strategy(s.Strategy), SampleInputs(s))
			if err != nil {
				return plot.Figure{}, fmt.Errorf("predict sample %s %d bytes: %w", s.Strategy, s.StateBytes, err)
			}
			x = append(x, float64(s.StateBytes)/1e6)
			md, mt = append(md, s.DowntimeMs), append(mt, s.TotalMs)
			pd, pt = append(pd, pr.DowntimeMs), append(pt, pr.TotalMs)
			for _, v := range []float64{s.DowntimeMs, s.TotalMs} {
				if v > 0 {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		down.Series = append(down.Series,
			plot.Series{Name: name, X: x, Y: pd, Line: true, Color: color},
			plot.Series{X: x, Y: md, Markers: true, Color: color})
		total.Series = append(total.Series,
			plot.Series{Name: name, X: x, Y: pt, Line: true, Color: color},
			plot.Series{X: x, Y: mt, Markers: true, Color: color})
		scatter.Series = append(scatter.Series,
			plot.Series{Name: name, X: append(append([]float64{}, md...), mt...), Y: append(append([]float64{}, pd...), pt...), Markers: true, Color: color})
	}
	if hi > 0 {
		scatter.Series = append(scatter.Series, plot.Series{Name: "model = measured", X: []float64{lo, hi}, Y: []float64{lo, hi}, Line: true, Dashed: true, Color: "#000000"})
	}
	return plot.Figure{Title: "edgehop migrations: model (lines) vs measured (crosses)", Panels: []plot.Panel{down, total, scatter}}, nil
}

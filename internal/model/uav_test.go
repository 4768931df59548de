package model

import (
	"errors"
	"testing"
)

// TestTableIV checks DefaultUAV against Table IV.
func TestTableIV(t *testing.T) {
	u := DefaultUAV()
	approx(t, "D*_s", u.SafetyDistanceM, 30)
	approx(t, "m_UAV", u.MassKg, 3)
	approx(t, "F_b", u.BrakeForceN, 5)
	approx(t, "T^v", u.VideoLatencyMs, 30)
	approx(t, "r", u.NormalizedRate, 0.25)
	approx(t, "M", u.StateBytes, 20e6)
	approx(t, "T^proc", u.ProcMs, 10)
}

// TestUAVEquations checks eqs. 35–37 on hand-computed values.
func TestUAVEquations(t *testing.T) {
	p, u := DefaultParams(), DefaultUAV()
	// Eq. 35: "D_r(v) = v·(T^down_coat + T^v + T^proc)": 5·(1000 + 30 + 10) ms = 5.2 m.
	approx(t, "eq35", u.ReactionDistance(5, 1000), 5.2)
	// Eq. 36: "D_b(v) = v²·m_UAV/(2·F_b)": 25·3/10 = 7.5 m.
	approx(t, "eq36", u.BrakingDistance(5), 7.5)

	// Eq. 37: "L ≥ v·V(M,R̂) / (D*_s − D_b(v) − v·(T^v + T^proc + T^down_coat − T^net))".
	// M = 20 MB, r = 0.25:
	//   dump 1.92·(84 + 40 + 10⁻⁷·7.5·2·10⁷) = 1.92·139 = 266.88 ms,
	//   restore 6.27·(60 + 16) = 476.52 ms, COAT 241 ms: 984.4 ms without T^net;
	//   V = 0.75·(4·10·4096) + 0.25·(10 + 5000)·4096 = 5253120 B.
	// At v = 5 m/s: 30 − 7.5 − 5·1.0244 = 17.378 m, so
	//   L = 5·8·5253120/17.378 = 12091425.94 bit/s.
	approx(t, "processing", p.COATProcessingDowntimeMs(u.StateBytes, u.NormalizedRate), 984.4)
	approx(t, "V", p.DumpVolume(u.StateBytes, u.NormalizedRate), 5253120)
	l, err := u.RequiredBandwidth(p, 5)
	if err != nil {
		t.Fatal(err)
	}
	approx(t, "eq37", l, 5*8*5253120/17.378)
	// Eq. 37 is eqs. 35–36 with D_s(v) = D*_s: at the required bandwidth the
	// stopping distance is exactly the safety threshold.
	for _, v := range []float64{1, 3, 5, 7, 8} {
		l, err := u.RequiredBandwidth(p, v)
		if err != nil {
			t.Fatalf("v=%g: %v", v, err)
		}
		approx(t, "D_s at eq37", u.StoppingDistance(p, v, l), u.SafetyDistanceM)
	}
	// Above v ≈ 8.44 m/s (0.3v² + 1.0244v = 30) braking and processing use
	// up the 30 m: no bandwidth is enough.
	if _, err := u.RequiredBandwidth(p, 8.5); !errors.Is(err, ErrInfeasible) {
		t.Errorf("v = 8.5 m/s: err = %v, want ErrInfeasible", err)
	}
	if _, err := u.RequiredBandwidth(p, 8.4); err != nil {
		t.Errorf("v = 8.4 m/s: %v", err)
	}
}

// TestFig18Trends checks what Sec. VIII-B reads off Fig. 18: "the required
// bandwidth always increases with v", "the required network bandwidth has
// a positive correlation with r", and latency and mass matter little at
// low speed but significantly near the braking limit.
func TestFig18Trends(t *testing.T) {
	p := DefaultParams()
	variants, fig, err := Fig18(p, DefaultUAV())
	if err != nil {
		t.Fatal(err)
	}
	if len(fig.Panels) != 3 || len(variants) != 11 {
		t.Fatalf("%d panels, %d variants", len(fig.Panels), len(variants))
	}
	byLabel := map[string][]UAVPoint{}
	for _, v := range variants {
		byLabel[v.Label] = v.Points
		// Increasing in v while feasible, and once infeasible it stays so.
		prev, infeasible := 0.0, false
		for _, pt := range v.Points {
			if !pt.Feasible {
				infeasible = true
				continue
			}
			if infeasible {
				t.Errorf("%s: feasible again at %g m/s", v.Label, pt.SpeedMps)
			}
			if pt.RequiredBps <= prev {
				t.Errorf("%s: L(%g) = %g does not increase", v.Label, pt.SpeedMps, pt.RequiredBps)
			}
			prev = pt.RequiredBps
		}
	}
	at := func(label string, v float64) UAVPoint {
		for _, pt := range byLabel[label] {
			if pt.SpeedMps == v {
				return pt
			}
		}
		t.Fatalf("no point %s at %g", label, v)
		return UAVPoint{}
	}
	// Fig. 18a: positive correlation with r at every feasible speed.
	for _, v := range []float64{1, 3, 5, 7} {
		prev := 0.0
		for _, label := range []string{"r = 0", "r = 0.25", "r = 0.5", "r = 0.75", "r = 1"} {
			pt := at(label, v)
			if !pt.Feasible {
				continue
			}
			if pt.RequiredBps <= prev {
				t.Errorf("v=%g: %s needs %g, not more than the lower rate", v, label, pt.RequiredBps)
			}
			prev = pt.RequiredBps
		}
	}
	// Fig. 18b: "the streaming latency has negligible impact on the required
	// value of L for values of maximum UAV speed lower than 7.5 m/s. On the
	// contrary, for higher values of speed ... the effect ... becomes
	// significant." At 1 m/s 30 → 300 ms changes L by under 2 %; near the
	// limit, at 7.5 m/s, by more than 20 %.
	ratio := func(a, b string, v float64) float64 { return at(b, v).RequiredBps / at(a, v).RequiredBps }
	if r := ratio("T^v = 30 ms", "T^v = 300 ms", 1); r > 1.02 {
		t.Errorf("latency at 1 m/s changes L by %.3f", r)
	}
	if r := ratio("T^v = 30 ms", "T^v = 300 ms", 7.5); !(r > 1.2) && at("T^v = 300 ms", 7.5).Feasible {
		t.Errorf("latency at 7.5 m/s changes L by only %.3f", r)
	}
	// Fig. 18c: mass matters little below 5 m/s, a lot above.
	if r := ratio("m_UAV = 1 kg", "m_UAV = 5 kg", 1); r > 1.1 {
		t.Errorf("mass at 1 m/s changes L by %.3f", r)
	}
	if r := ratio("m_UAV = 1 kg", "m_UAV = 5 kg", 6); !(r > 2) && at("m_UAV = 5 kg", 6).Feasible {
		t.Errorf("mass at 6 m/s changes L by only %.3f", r)
	}
}

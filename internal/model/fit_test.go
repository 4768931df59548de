package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// machine is a made-up node pair whose coefficients the fit must recover.
// It differs from Table III everywhere the fit estimates something.
func machine() Params {
	p := DefaultParams()
	p.Name = "truth"
	p.Alpha1, p.Alpha2, p.Alpha3, p.Alpha4 = 1, 1.15, 1, 1.3
	p.BetaMs = 20
	p.PhiDMs, p.Xi.Max = 15, 15   // Γξ(R_max) = 1.5·10⁻⁶ ms/B
	p.DeltaMs, p.Eta.Max = 2, 0.4 // Λη(R_max) = 1.2·10⁻⁶ ms/B
	p.MuP, p.NuPPerByte = 60, 1.01/4096
	p.NuD.Max = p.NuPPerByte
	p.PsiMs, p.OmegaMsPerByte = 40, 1.1e-6
	p.SwitchMs = 35
	p.NetFixedMs, p.NetFactor = 5, 1.1
	p.DiffMsPerByte = 5e-7
	p.LiveReadMs, p.LiveReadMsPerByte = 3, 8e-7
	p.LazyMsPerByte, p.LocalInstallMsPerByte = 4e-6, 1e-6
	p.LazyFixedMs, p.LazyFaultMsPerPage = 300, 0.05
	p.CompressRatio = 0.6
	p.PrepareMs, p.CleanupMs = 50, 20
	return p
}

// synthSamples measures migrations on the machine with noise: CRIU's
// statistics follow the PAM relations, the phases the machine's prediction,
// each perturbed by about noise (relative standard deviation).
func synthSamples(truth Params, pair string, strategies []Strategy, noise float64, seed uint64) []Sample {
	rng := rand.New(rand.NewPCG(seed, 7))
	jit := func(v float64) float64 { return v * (1 + noise*rng.NormFloat64()) }
	var out []Sample
	for _, s := range strategies {
		for _, mb := range []float64{10, 25, 50, 100, 200, 400} {
			for _, l := range []float64{1e8, 1e9} {
				for _, rate := range []float64{1e3, 1e4} {
					for _, rtt := range []float64{1, 10} {
						m := mb * 1e6
						in := Inputs{StateBytes: m, DirtyRate: rate, BandwidthBps: l, RTTMs: rtt}
						if s.rounds() {
							in.Iterations = 1 + rng.IntN(3)
						}
						in.Compressed = rng.IntN(6) == 0
						pr, err := truth.Predict(s, in)
						if err != nil {
							panic(err)
						}
						eager := m
						if s.lazy() {
							eager = 0
						}
						smp := Sample{Strategy: string(s), Pair: pair, StateBytes: int64(m), DirtyRate: rate, BandwidthBps: l,
							RTTMs: rtt, Iterations: in.Iterations, Compressed: in.Compressed, BytesOnWire: int64(pr.BytesOnWire),
							PhasesMs: map[string]float64{}, CRIU: map[string]float64{}}
						for _, ph := range pr.Phases { // in order: the noise is drawn deterministically
							smp.PhasesMs[ph.Name] = jit(ph.Ms)
						}
						// CRIU's own view (µs) follows eqs. 15, 17 and 26;
						// edgehop's phases are its layered multiples
						// (Observation 1), each with its own noise.
						freezing := jit(truth.BetaMs)
						frozen := jit(truth.PhiDMs + truth.GammaMsPerByte*truth.Xi.Max*eager)
						restore := jit(truth.PsiMs + truth.OmegaMsPerByte*eager)
						smp.CRIU[KeyFreezingUs], smp.CRIU[KeyFrozenUs], smp.CRIU[KeyRestoreUs] = freezing*1000, frozen*1000, restore*1000
						smp.PhasesMs[PhaseFreeze] = jit(truth.ckpt() * freezing)
						smp.PhasesMs[PhaseDump] = jit(truth.ckpt() * frozen)
						smp.PhasesMs[PhaseRestore] = jit(truth.rest() * restore)
						for _, ph := range pr.Phases {
							smp.TotalMs += smp.PhasesMs[ph.Name]
							if ph.Downtime {
								smp.DowntimeMs += smp.PhasesMs[ph.Name]
							}
						}
						mem := jit(truth.DeltaMs + truth.LambdaMsPerByte*truth.Eta.Max*eager)
						smp.CRIU[KeyMemdumpUs], smp.CRIU[KeyMemwriteUs] = 600*mem, 400*mem
						smp.CRIU[KeyPagesWritten] = math.Round(jit(truth.MuP + truth.NuPPerByte*eager))
						if s.lazy() {
							smp.CRIU[KeyPagesLazy] = math.Round(truth.NuPPerByte * m)
						}
						var precopy float64
						for _, r := range pr.Rounds {
							precopy += r.WireBytes
						}
						if s.rounds() {
							smp.CRIU[KeyPrecopyBytes] = precopy
						}
						if s.lazy() {
							// The last wire bytes are the lazy pull.
							raw := truth.Tau1 * truth.NuPPerByte * m * truth.PageBytes
							if s == Hybrid {
								last := pr.Rounds[len(pr.Rounds)-1].Ms
								raw = truth.Tau1 * math.Min(rate*last/1000, truth.NuPPerByte*m) * truth.PageBytes
							}
							rho := 1.0
							if in.Compressed {
								rho = truth.CompressRatio
							}
							smp.CRIU[KeyLazyBytes] = rho * raw
						}
						if in.Compressed {
							smp.CRIU[KeyRawBytes] = pr.BytesOnWire / truth.CompressRatio
						}
						out = append(out, smp)
					}
				}
			}
		}
	}
	return out
}

func relation(t *testing.T, set FittedSet, name string) Relation {
	t.Helper()
	for _, r := range set.Relations {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("%s %s: no relation %q (skipped %v)", set.Pair, set.Strategy, name, set.Skipped)
	return Relation{}
}

func within(t *testing.T, name string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*math.Abs(want) {
		t.Errorf("%s = %.6g, want %.6g ± %.0f%%", name, got, want, rel*100)
	}
}

// TestFitRecoversCoefficients fits noisy synthetic migrations of all four
// strategies and checks every relation the issue lists: the freeze
// constant (Obs. 2), frozen and memory times linear in M (Obs. 3–4), pages
// written vs M (Obs. 5), restore linear in M (Obs. 8), the layer factors
// (Obs. 1), the network switch (Obs. 9), and edgehop's own terms.
func TestFitRecoversCoefficients(t *testing.T) {
	truth := machine()
	samples := synthSamples(truth, "node0->node1", EdgehopStrategies, 0.02, 42)
	res, err := Fit(samples)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sets) != 5 {
		t.Fatalf("%d sets, want 4 strategies + pooled", len(res.Sets))
	}
	pooled, err := res.Lookup("node0->node1", PooledStrategy)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want float64
		tol       float64
	}{
		{"β (eq. 15)", pooled.BetaMs, truth.BetaMs, 0.02},
		{"φᵈ (eq. 17)", pooled.PhiDMs, truth.PhiDMs, 0.10},
		{"Γξ(R_max) (eq. 17)", pooled.GammaMsPerByte * pooled.Xi.Max, truth.GammaMsPerByte * truth.Xi.Max, 0.03},
		{"δ (eq. 20)", pooled.DeltaMs, truth.DeltaMs, 0.15},
		{"Λη (eq. 20)", pooled.LambdaMsPerByte * pooled.Eta.Max, truth.LambdaMsPerByte * truth.Eta.Max, 0.03},
		{"μᵖ (eq. 22)", pooled.MuP, truth.MuP, 0.25},
		{"νᵖ (eq. 22)", pooled.NuPPerByte, truth.NuPPerByte, 0.02},
		{"ψ (eq. 26)", pooled.PsiMs, truth.PsiMs, 0.05},
		{"ω (eq. 26)", pooled.OmegaMsPerByte, truth.OmegaMsPerByte, 0.03},
		{"α1α2 (Obs. 1)", pooled.ckpt(), truth.ckpt(), 0.02},
		{"α3α4 (Obs. 1)", pooled.rest(), truth.rest(), 0.02},
		{"switch (Obs. 9)", pooled.SwitchMs, truth.SwitchMs, 0.02},
		{"net factor", pooled.NetFactor, truth.NetFactor, 0.03},
		{"diff per byte", pooled.DiffMsPerByte, truth.DiffMsPerByte, 0.25},
		{"live read per byte", pooled.LiveReadMsPerByte, truth.LiveReadMsPerByte, 0.10},
		{"lazy per byte", pooled.LazyMsPerByte, truth.LazyMsPerByte, 0.10},
		{"local install per byte", pooled.LocalInstallMsPerByte, truth.LocalInstallMsPerByte, 0.25},
		{"lazy fixed", pooled.LazyFixedMs, truth.LazyFixedMs, 0.15},
		{"lazy fault per page", pooled.LazyFaultMsPerPage, truth.LazyFaultMsPerPage, 0.10},
		{"compress ratio", pooled.CompressRatio, truth.CompressRatio, 1e-6},
		{"prepare", pooled.PrepareMs, truth.PrepareMs, 0.02},
		{"cleanup", pooled.CleanupMs, truth.CleanupMs, 0.02},
	} {
		within(t, c.name, c.got, c.want, c.tol)
	}
	// Goodness of fit: the linear relations explain the data.
	for _, set := range res.Sets {
		for _, name := range []string{"dump_frozen", "memory", "pages", "restore"} {
			if set.Strategy == string(PostCopy) || set.Strategy == string(Hybrid) {
				continue // x = eager bytes is always 0: a constant
			}
			r := relation(t, set, name)
			if r.R2 == nil || *r.R2 < 0.98 {
				t.Errorf("%s %s: R² = %v, want ≥ 0.98", set.Strategy, name, r.R2)
			}
		}
		// In-sample prediction error of the whole model.
		if set.Validation.N == 0 || set.Validation.DowntimeMAPEPercent > 5 || set.Validation.TotalMAPEPercent > 5 {
			t.Errorf("%s: validation %+v", set.Strategy, set.Validation)
		}
	}
	// A lazy-only set estimates the dump floor as a constant and keeps the
	// slope it cannot see from the pair's pooled fit, not Table III.
	post, err := res.Lookup("node0->node1", PostCopy)
	if err != nil {
		t.Fatal(err)
	}
	pooled, err = res.Lookup("node0->node1", PooledStrategy)
	if err != nil {
		t.Fatal(err)
	}
	within(t, "post-copy φᵈ", post.PhiDMs, truth.PhiDMs, 0.05)
	approx(t, "post-copy keeps the pooled ξ(R_max)", post.Xi.Max, pooled.Xi.Max)
	if post.Xi.Max == DefaultParams().Xi.Max {
		t.Errorf("post-copy ξ(R_max) is Table III's %v, want the pooled fit's", post.Xi.Max)
	}
	within(t, "post-copy νᵖ from pages_lazy", post.NuPPerByte, truth.NuPPerByte, 1e-3)
	if r := relation(t, setOf(t, res, PostCopy), "dump_frozen"); r.Kind != "constant" {
		t.Errorf("post-copy dump_frozen kind %q, want constant", r.Kind)
	}
	// The fitted sets predict the machine, not Table III.
	in := Inputs{StateBytes: 3e8, DirtyRate: 5e3, BandwidthBps: 5e8, RTTMs: 4, Iterations: 2}
	for _, s := range EdgehopStrategies {
		fp, err := res.Lookup("node0->node1", s)
		if err != nil {
			t.Fatal(err)
		}
		want := mustPredict(t, truth, s, in)
		got := mustPredict(t, fp, s, in)
		within(t, string(s)+" downtime", got.DowntimeMs, want.DowntimeMs, 0.05)
		within(t, string(s)+" total", got.TotalMs, want.TotalMs, 0.05)
	}
}

func setOf(t *testing.T, res FitResult, s Strategy) FittedSet {
	t.Helper()
	for _, set := range res.Sets {
		if set.Strategy == string(s) {
			return set
		}
	}
	t.Fatalf("no set for %s", s)
	return FittedSet{}
}

// TestFitNoiseLowersR2: the goodness of fit reports noise; a fit on pure
// noise is not mistaken for a good one.
func TestFitNoiseLowersR2(t *testing.T) {
	truth := machine()
	clean, _ := Fit(synthSamples(truth, "a->b", []Strategy{StopAndCopy}, 0.001, 1))
	noisy, _ := Fit(synthSamples(truth, "a->b", []Strategy{StopAndCopy}, 0.3, 1))
	rc := relation(t, clean.Sets[0], "restore")
	rn := relation(t, noisy.Sets[0], "restore")
	if !(*rc.R2 > 0.999 && *rn.R2 < *rc.R2 && rn.RMSE > rc.RMSE) {
		t.Errorf("R² clean %.5f noisy %.5f, RMSE %.3g %.3g", *rc.R2, *rn.R2, rc.RMSE, rn.RMSE)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var x [][]float64
	var y []float64
	for i := 0; i < 200; i++ {
		x = append(x, []float64{rng.Float64()})
		y = append(y, rng.Float64())
	}
	r, ok := lsq(x, y, true)
	if !ok || r.r2 == nil || *r.r2 > 0.1 {
		t.Errorf("R² of noise = %v", r.r2)
	}
}

// TestFitSingleStateSize: with one state size the slope is not
// identifiable; the Table III line is scaled to the measured level, so the
// prediction at that size is still right.
func TestFitSingleStateSize(t *testing.T) {
	truth := machine()
	var samples []Sample
	for _, s := range synthSamples(truth, "a->b", []Strategy{StopAndCopy}, 0.01, 5) {
		if s.StateBytes == 100e6 {
			samples = append(samples, s)
		}
	}
	res, err := Fit(samples)
	if err != nil {
		t.Fatal(err)
	}
	set := res.Sets[0]
	r := relation(t, set, "dump_frozen")
	if r.Kind != "scaled" {
		t.Errorf("dump_frozen kind %q, want scaled", r.Kind)
	}
	got := set.Params.DumpFrozenMs(100e6, 1)
	within(t, "frozen at the sampled size", got, truth.DumpFrozenMs(100e6, 1), 0.02)
	if set.Params.PhiDMs < 0 || set.Params.Validate() != nil {
		t.Errorf("fitted set invalid: %v", set.Params.Validate())
	}
}

func TestFitErrors(t *testing.T) {
	if _, err := Fit(nil); !errors.Is(err, ErrNoSamples) {
		t.Errorf("no samples: %v", err)
	}
	good := Sample{Strategy: "stop-and-copy", Pair: "a->b", StateBytes: 1e6, BandwidthBps: 1e9}
	for name, mod := range map[string]func(*Sample){
		"paper model":  func(s *Sample) { s.Strategy = "pam-coat" },
		"no pair":      func(s *Sample) { s.Pair = "" },
		"no state":     func(s *Sample) { s.StateBytes = 0 },
		"no bandwidth": func(s *Sample) { s.BandwidthBps = 0 },
	} {
		s := good
		mod(&s)
		if _, err := Fit([]Sample{s}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// A sample without any statistics fits nothing and keeps Table III.
	res, err := Fit([]Sample{good})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sets[0].Params.BetaMs != DefaultParams().BetaMs || len(res.Sets[0].Skipped) == 0 {
		t.Errorf("empty sample changed parameters: %+v", res.Sets[0])
	}
	if _, err := res.Lookup("x->y", StopAndCopy); !errors.Is(err, ErrNoParams) {
		t.Errorf("lookup of unknown pair: %v", err)
	}
	// Lookup falls back to the pooled set, and "" picks the only pair.
	p, err := res.Lookup("", PostCopy)
	if err != nil || p.Name != "fit a->b *" {
		t.Errorf("lookup fallback: %q %v", p.Name, err)
	}
}

// TestLSQ checks the least-squares core on an exact two-variable plane.
func TestLSQ(t *testing.T) {
	var x [][]float64
	var y []float64
	for i := 0; i < 10; i++ {
		a, b := float64(i)*1e7, float64(i%3)
		x = append(x, []float64{a, b, 0})
		y = append(y, 5+2e-6*a-3*b)
	}
	r, ok := lsq(x, y, true)
	if !ok {
		t.Fatal("lsq failed")
	}
	approx(t, "intercept", r.intercept, 5)
	approx(t, "slope a", r.slopes[0], 2e-6)
	approx(t, "slope b", r.slopes[1], -3)
	if r.used[2] || r.slopes[2] != 0 {
		t.Errorf("all-zero column used: %v", r)
	}
	approx(t, "R²", *r.r2, 1)
	if _, ok := lsq([][]float64{{1}}, []float64{2}, true); !ok {
		t.Errorf("one point, constant x: the intercept alone should fit")
	}
	if _, ok := lsq([][]float64{{1}, {2}}, []float64{2, 3}, false); !ok {
		t.Errorf("ratio fit failed")
	}
}

// TestSyntheticSamplesFile keeps testdata/synthetic_samples.jsonl, a small
// set of synthetic measurements (machine(), 2 % noise) in the Sample JSON
// format the migration code emits, for the CLI tests and for trying
// 'edgehop model fit'. Regenerate with -rewrite.
func TestSyntheticSamplesFile(t *testing.T) {
	all := synthSamples(machine(), "node0->node1", EdgehopStrategies, 0.02, 11)
	var b bytes.Buffer
	for i, s := range all {
		if i%4 != 0 {
			continue
		}
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
	}
	checkGolden(t, "synthetic_samples.jsonl", b.Bytes())
	// The file round-trips into samples the fit accepts.
	var back []Sample
	for _, line := range bytes.Split(bytes.TrimSpace(b.Bytes()), []byte("\n")) {
		var s Sample
		if err := json.Unmarshal(line, &s); err != nil {
			t.Fatal(err)
		}
		back = append(back, s)
	}
	if _, err := Fit(back); err != nil {
		t.Fatal(err)
	}
}

// A migration slowed by a neighbour's load is an outlier: the robust fit
// keeps the line the other points follow, where plain least squares is
// pulled away.
func TestRobustFitResistsOutlier(t *testing.T) {
	var x [][]float64
	var y []float64
	for i := 0; i < 12; i++ {
		xi := float64(10 + 10*i)
		yi := (100 + 3*xi) * (1 + 0.01*float64(i%3-1)) // ±1% noise
		if i == 7 {
			yi *= 2.5 // the outlier
		}
		x, y = append(x, []float64{xi}), append(y, yi)
	}
	w := relWeights(y)
	plain, ok1 := wlsq(x, y, w, true)
	robust, ok2 := robustWLSQ(x, y, w, true)
	if !ok1 || !ok2 {
		t.Fatal("fit failed")
	}
	if math.Abs(robust.slopes[0]-3) > 0.1 || math.Abs(robust.intercept-100) > 8 {
		t.Errorf("robust fit %.3g + %.3g·x, want 100 + 3·x", robust.intercept, robust.slopes[0])
	}
	if math.Abs(plain.slopes[0]-3) < 0.1 && math.Abs(plain.intercept-100) < 8 {
		t.Errorf("plain fit %.3g + %.3g·x is not pulled by the outlier: the test shows nothing", plain.intercept, plain.slopes[0])
	}
	// Constants: a Huber mean, not the mean.
	c, ok := robustWLSQ(make([][]float64, 9), []float64{30, 31, 29, 30, 32, 28, 30, 31, 250}, nil, true)
	if !ok || math.Abs(c.intercept-30.2) > 1.5 {
		t.Errorf("robust constant %v, want about 30", c.intercept)
	}
	// Too few points to tell an outlier: the plain fit.
	few, _ := robustWLSQ(x[:3], y[:3], nil, true)
	fp, _ := wlsq(x[:3], y[:3], nil, true)
	if few.intercept != fp.intercept || few.slopes[0] != fp.slopes[0] {
		t.Errorf("3 points: robust %+v, plain %+v", few, fp)
	}
}

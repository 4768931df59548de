package model

import (
	"errors"
	"math"
	"testing"
)

// Hand-computed values below use the Table III parameters and, unless said
// otherwise, M = 100 MB = 10⁸ B and L = 1 Gbit/s. MB is 10⁶ bytes.
const (
	m100 = 1e8
	gbit = 1e9
)

func approx(t *testing.T, name string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.10g, want %.10g", name, got, want)
	}
}

// TestTableIII checks that DefaultParams carries Tables II and III.
func TestTableIII(t *testing.T) {
	p := DefaultParams()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"α1", p.Alpha1, 1.6}, {"α2", p.Alpha2, 1.2}, {"α3", p.Alpha3, 3.3}, {"α4", p.Alpha4, 1.9},
		{"σ", p.PageBytes, 4096}, {"β", p.BetaMs, 84}, {"φp", p.PhiPMs, 6.0}, {"φd", p.PhiDMs, 40},
		{"ζ", p.Zeta, 1.0}, {"ξ(Rmin)", p.Xi.Min, 0}, {"ξ(Rmax)", p.Xi.Max, 30},
		{"δ", p.DeltaMs, 1.8}, {"Λ", p.LambdaMsPerByte, 3e-6}, {"Γ", p.GammaMsPerByte, 1e-7},
		{"η(Rmin)", p.Eta.Min, 0.0075}, {"η(Rmax)", p.Eta.Max, 0.75},
		// "τ2(Rmin), τ2(Rmax) | 4.0, τ1"
		{"τ1", p.Tau1, 1.0}, {"τ2(Rmin)", p.Tau2.Min, 4.0}, {"τ2(Rmax)", p.Tau2.Max, p.Tau1},
		// "νd(Rmin), νd(Rmax) | 0, νp"
		{"μp", p.MuP, 45}, {"μd", p.MuD, 10}, {"νp", p.NuPPerByte, 2.5e-4},
		{"νd(Rmin)", p.NuD.Min, 0}, {"νd(Rmax)", p.NuD.Max, p.NuPPerByte},
		{"ψ", p.PsiMs, 60}, {"ω", p.OmegaMsPerByte, 8e-7},
		// Table II: 69, 101 and 71 ms.
		{"ns_clear", p.NSClearMs, 69}, {"ns_conf", p.NSConfMs, 101}, {"flow", p.FlowMs, 71},
	} {
		approx(t, c.name, c.got, c.want)
	}
	// Observation 9: "the steps introduced by the COAT solution ... roughly
	// amounting to 240 ms."
	approx(t, "T^add_coat", p.COATAddMs(), 241)
}

// TestCheckpointRelations checks eqs. 15–25 on hand-computed values.
func TestCheckpointRelations(t *testing.T) {
	p := DefaultParams()
	tests := []struct {
		name      string
		got, want float64
	}{
		// Eq. 15: "T^{p,freeze}_criu = β ; T^{d,freeze}_criu,i = T^freeze_criu = β ∀i".
		{"eq15 β", p.BetaMs, 84},
		// Eq. 16, 18: "T^{p,frozen}_criu(M) = φᵖ + γᵖ·M", "γᵖ = Γ·ζ":
		// 6 + 10⁻⁷·1·10⁸ = 16 ms.
		{"eq16", p.PredumpFrozenMs(m100), 16},
		// Eq. 17, 18: "T^{d,frozen}_criu,i(M,Rᵢ) = φᵈ + γᵈ(Rᵢ)·M", "γᵈ = Γ·ξ(Rᵢ)":
		// R_max: 40 + 10⁻⁷·30·10⁸ = 340 ms; R_min: 40 + 0 = 40 ms;
		// r = 0.25: ξ = 7.5, 40 + 75 = 115 ms.
		{"eq17 Rmax", p.DumpFrozenMs(m100, 1), 340},
		{"eq17 Rmin", p.DumpFrozenMs(m100, 0), 40},
		{"eq17 r=0.25", p.DumpFrozenMs(m100, 0.25), 115},
		// Eq. 19: "T^{p,mem}_criu(M) = δ + Λ·M": 1.8 + 3·10⁻⁶·10⁸ = 301.8 ms.
		{"eq19", p.PredumpMemMs(m100), 301.8},
		// Eq. 20: "T^{d,mem}_criu,i(M,Rᵢ) = δ + Λ·η(Rᵢ)·M":
		// R_max: 1.8 + 3·10⁻⁶·0.75·10⁸ = 226.8 ms; R_min: 1.8 + 2.25 = 4.05 ms.
		{"eq20 Rmax", p.DumpMemMs(m100, 1), 226.8},
		{"eq20 Rmin", p.DumpMemMs(m100, 0), 4.05},
		// Eq. 22: "Nᵖ(M) = μᵖ + νᵖ·M": 45 + 2.5·10⁻⁴·10⁸ = 25045 pages.
		{"eq22", p.PredumpPages(m100), 25045},
		// Eq. 23: "Nᵈᵢ(M,R_{i−1}) = μᵈ + νᵈ(R_{i−1})·M": R_max 10 + 25000; R_min 10.
		{"eq23 Rmax", p.DumpPages(m100, 1), 25010},
		{"eq23 Rmin", p.DumpPages(m100, 0), 10},
		// Eq. 24: "V₀(M) = ρ(τ₁(M)·Nᵖ(M)·σ + ε)", ε omitted: 1·1·25045·4096.
		{"eq24", p.PredumpVolume(m100), 102584320},
		// Eq. 25: "Vᵢ(M,R_{i−1}) = ρ(τ₂(M,R_{i−1})·Nᵈᵢ(M,R_{i−1})·σ + ε)":
		// R_max 1·25010·4096 = 102440960 B; R_min 4·10·4096 = 163840 B;
		// r = 0.5 interpolates the two volumes: 51302400 B.
		{"eq25 Rmax", p.DumpVolume(m100, 1), 102440960},
		{"eq25 Rmin", p.DumpVolume(m100, 0), 163840},
		{"eq25 r=0.5", p.DumpVolume(m100, 0.5), 51302400},
		// "we write the time needed to transfer Vᵢ data over a link of
		// capacity L as Tᵢ^net = Vᵢ/L": 102584320·8/10⁹ s = 820.67456 ms.
		{"T0 net", NetMs(p.PredumpVolume(m100), gbit), 820.67456},
	}
	for _, tc := range tests {
		approx(t, tc.name, tc.got, tc.want)
	}
}

// TestLayeredDurations checks eqs. 13, 14 and 26.
func TestLayeredDurations(t *testing.T) {
	p := DefaultParams()
	// Eq. 13: "Tᵖ_podman = α1α2·(T^{p,freeze}_criu + T^{p,frozen}_criu + T^{p,mem}_criu)":
	// 1.6·1.2·(84 + 16 + 301.8) = 1.92·401.8 = 771.456 ms.
	approx(t, "eq13", p.PredumpMs(m100), 771.456)
	// Eq. 14: "Tᵈ_podman,i = α1α2·(T^{d,freeze}_criu,i + T^{d,frozen}_criu,i)":
	// R_max 1.92·(84 + 340) = 814.08 ms; R_min 1.92·(84 + 40) = 238.08 ms.
	approx(t, "eq14 Rmax", p.DumpMs(m100, 1), 814.08)
	approx(t, "eq14 Rmin", p.DumpMs(m100, 0), 238.08)
	// Eq. 26: "Tʳ_podman ≈ α3α4·T^reloc_criu = α3α4(ψ + ω·M)":
	// 3.3·1.9·(60 + 8·10⁻⁷·10⁸) = 6.27·140 = 877.8 ms.
	approx(t, "eq26", p.RestoreMs(m100), 877.8)
	// Observation 8: restore is "independent of the dirty page rate" — the
	// signature has no R at all; and it "linearly depends on the MS state
	// size": the increment per 100 MB is constant.
	approx(t, "eq26 linear", p.RestoreMs(3*m100)-p.RestoreMs(2*m100), p.RestoreMs(2*m100)-p.RestoreMs(m100))
}

// TestKPIs checks eqs. 27–32.
func TestKPIs(t *testing.T) {
	p := DefaultParams()
	// Eq. 27: "T₀ = α1α2·(T^freeze + T^{p,frozen} + T^{p,mem}) + T₀^net":
	// 771.456 + 820.67456 = 1592.13056 ms.
	approx(t, "eq27", p.Iteration0Ms(m100, gbit), 1592.13056)
	// Eq. 28: "Tᵢ = α1α2·(T^freeze + T^{d,frozen}_i) + Tᵢ^net", R_max:
	// 814.08 + 102440960·8/10⁹ s = 814.08 + 819.52768 = 1633.60768 ms.
	approx(t, "eq28", p.IterationMs(m100, 1, gbit), 1633.60768)
	// Eq. 29: "T^down = α1α2·(T^freeze + T^{d,frozen}_{I+1}) + T^net_{I+1} + α3α4·T^reloc":
	// R_max 1633.60768 + 877.8 = 2511.40768 ms;
	// R_min 238.08 + 163840·8/10⁹ s + 877.8 = 238.08 + 1.31072 + 877.8 = 1117.19072 ms.
	approx(t, "eq29 Rmax", p.DowntimeMs(m100, 1, gbit), 2511.40768)
	approx(t, "eq29 Rmin", p.DowntimeMs(m100, 0, gbit), 1117.19072)
	// Eq. 30: "T^mig = α1α2(...) + T₀^net + (I+1)·(α1α2·(T^freeze + T^{d,frozen}) + T^net) + α3α4·T^reloc",
	// I = 2, R_max: 1592.13056 + 3·1633.60768 + 877.8 = 7370.7536 ms.
	approx(t, "eq30", p.MigrationMs(m100, 1, gbit, 2), 7370.7536)
	// Eq. 1 says the same: "T^mig = Σ_{i=0}^{I} Tᵢ + T^down".
	approx(t, "eq1", p.MigrationMs(m100, 1, gbit, 2),
		p.Iteration0Ms(m100, gbit)+2*p.IterationMs(m100, 1, gbit)+p.DowntimeMs(m100, 1, gbit))
	// Eq. 31: COAT adds "T^ns_clear + T^ns_conf + T^flow": 2511.40768 + 241 = 2752.40768 ms.
	approx(t, "eq31", p.COATDowntimeMs(m100, 1, gbit), 2752.40768)
	// Eq. 32: 7370.7536 + 241 = 7611.7536 ms.
	approx(t, "eq32", p.COATMigrationMs(m100, 1, gbit, 2), 7611.7536)
	// Fig. 13: "Note that the downtime is independent of I."
	pr1, _ := p.Predict(PAMCOAT, Inputs{StateBytes: m100, DirtyRate: p.MaxDirtyRate(m100), BandwidthBps: gbit, Iterations: 1})
	pr5, _ := p.Predict(PAMCOAT, Inputs{StateBytes: m100, DirtyRate: p.MaxDirtyRate(m100), BandwidthBps: gbit, Iterations: 5})
	approx(t, "downtime independent of I", pr5.DowntimeMs, pr1.DowntimeMs)
	approx(t, "Predict pam-coat downtime", pr1.DowntimeMs, 2752.40768)
	approx(t, "Predict pam-coat total", pr1.TotalMs, p.COATMigrationMs(m100, 1, gbit, 1))
}

// TestEq33RequiredBandwidth checks eq. 33.
func TestEq33RequiredBandwidth(t *testing.T) {
	p := DefaultParams()
	// "L > V(M,R̂) / (θ^down − Tᵈ_podman(M,R̂) − Tʳ_podman(M) − T^add_coat)",
	// θ^down = 5 s, R_max: 8·102440960 bit / (5000 − 814.08 − 877.8 − 241) ms
	// = 819527680 / 3.06712 s = 267197788.153 bit/s.
	l, err := p.RequiredBandwidth(m100, 1, 5000)
	if err != nil {
		t.Fatal(err)
	}
	approx(t, "eq33", l, 819527680/3.06712)
	// At exactly that bandwidth eq. 31 gives θ^down.
	approx(t, "eq31 at eq33", p.COATDowntimeMs(m100, 1, l), 5000)
	// Below the processing time no bandwidth helps: 1932.88 ms > 1500 ms.
	if _, err := p.RequiredBandwidth(m100, 1, 1500); !errors.Is(err, ErrInfeasible) {
		t.Errorf("eq33 with θ below processing: err = %v, want ErrInfeasible", err)
	}
}

// TestEq34Iterations checks eq. 34 and its rounding.
func TestEq34Iterations(t *testing.T) {
	p := DefaultParams()
	// "I = ⌈(θ^mig − T₀(M,L) − T^down_coat(M,R̂,L)) / (Tᵈ_podman(M,R̂) + T_net(M,R̂,L))⌉",
	// θ^mig = 20 s: (20000 − 1592.13056 − 2752.40768)/1633.60768 = 9.5834.
	// The printed ⌈·⌉ gives 10, whose migration (eq. 32 form
	// "T₀ + I·Tᵢ + T^down_coat") takes 20680.6 ms > θ^mig; the floor, 9,
	// takes 19047.0 ms. MaxIterations returns the floor.
	n, err := p.MaxIterations(m100, 1, gbit, 20000)
	if err != nil {
		t.Fatal(err)
	}
	if n != 9 {
		t.Fatalf("eq34 I = %d, want 9", n)
	}
	mig := func(i int) float64 {
		return p.Iteration0Ms(m100, gbit) + float64(i)*p.IterationMs(m100, 1, gbit) + p.COATDowntimeMs(m100, 1, gbit)
	}
	approx(t, "T^mig(I=9)", mig(9), 19047.00736)
	if mig(n) > 20000 || mig(n+1) <= 20000 {
		t.Errorf("I = %d is not the largest that fits: %.1f, %.1f", n, mig(n), mig(n+1))
	}
	if _, err := p.MaxIterations(m100, 1, gbit, 3000); !errors.Is(err, ErrInfeasible) {
		t.Errorf("eq34 below T₀ + T^down: err = %v, want ErrInfeasible", err)
	}
}

// TestNormalizedRate checks Sec. IV-A's R_min/R_max and Sec. VIII-A's r.
func TestNormalizedRate(t *testing.T) {
	p := DefaultParams()
	// "ranging from R_min = 1 page/ΔT to R_max = ⌊M/σ⌋/ΔT", ΔT = 1 s (Fig. 7):
	// ⌊10⁸/4096⌋ = 24414 pages/s.
	approx(t, "R_min", p.MinDirtyRate(), 1)
	approx(t, "R_max", p.MaxDirtyRate(m100), 24414)
	// "r = (R̂ − R_min)/(R_max − R_min)"
	approx(t, "r(R_min)", p.NormalizedRate(m100, 1), 0)
	approx(t, "r(R_max)", p.NormalizedRate(m100, 24414), 1)
	approx(t, "r(mid)", p.NormalizedRate(m100, 1+24413.0/4), 0.25)
	approx(t, "r clamps", p.NormalizedRate(m100, 1e9), 1)
}

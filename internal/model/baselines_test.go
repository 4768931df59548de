package model

import "testing"

// TestSotA checks the network-only baseline PAM is compared with:
// "not accounting for the processing contribution (as in [4]), the
// duration of each iteration consists of the network transfer time only.
// In this case, the number of pages to be transmitted decreases at each
// iteration, and so does the iteration duration."
func TestSotA(t *testing.T) {
	// M = 100 MB, R = 10⁴ pages/s, σ = 4096 B, L = 1 Gbit/s, I = 1:
	// T₀ = 8·10⁸/10⁹ s = 800 ms;
	// V₁ = 10⁴·0.8·4096 = 32768000 B, T₁ = 262.144 ms;
	// V₂ = 10⁴·0.262144·4096 = 10737418.24 B, T₂ = 85.89934592 ms = downtime;
	// total = 800 + 262.144 + 85.89934592 = 1148.04334592 ms.
	res := SotA{StateBytes: m100, DirtyRate: 1e4, PageBytes: 4096, BandwidthBps: gbit, Iterations: 1}.Predict()
	if len(res.VolumesBytes) != 3 {
		t.Fatalf("volumes %v, want 3", res.VolumesBytes)
	}
	approx(t, "V1", res.VolumesBytes[1], 32768000)
	approx(t, "V2", res.VolumesBytes[2], 10737418.24)
	approx(t, "downtime", res.DowntimeMs, 85.89934592)
	approx(t, "total", res.TotalMs, 1148.04334592)
	for i := 1; i < len(res.VolumesBytes); i++ {
		if res.VolumesBytes[i] >= res.VolumesBytes[i-1] {
			t.Errorf("SotA volume %d = %g does not decrease", i, res.VolumesBytes[i])
		}
	}
	// At R_max the dirty pages are capped at the state: every iteration
	// resends M.
	capped := SotA{StateBytes: m100, DirtyRate: 1e6, PageBytes: 4096, BandwidthBps: gbit, Iterations: 2}.Predict()
	approx(t, "capped downtime", capped.DowntimeMs, 800)
	approx(t, "capped total", capped.TotalMs, 4*800)
}

// TestARNAB checks eqs. 1–7 of ARNAB on hand-computed values:
// M_init = 100 MB, D_rate = 20 MB/s, C_rate = 100 MB/s, T_cpf = 200 ms,
// T_fw = 50 ms, T_fr = 300 ms, T_rtf = 100 ms, T_isync = 1 s, n = 2.
func TestARNAB(t *testing.T) {
	a := ARNAB{InitBytes: 100e6, DirtyBps: 20e6, CopyBps: 100e6, CheckpointMs: 200, FileWriteMs: 50,
		RestoreFuncMs: 300, RestoreFilesMs: 100, ImageSyncMs: 1000, Iterations: 2}
	res := a.Predict()
	// Eq. 1: "Mᵢ = M_init if i = 0; D_rate·T_c(i−1) otherwise":
	// M₀ = 100 MB, M₁ = 20 MB/s·1 s = 20 MB, M₂ = 20 MB/s·0.2 s = 4 MB.
	// Eq. 2: "T_ci = Mᵢ/C_rate": 1000, 200, 40 ms.
	for i, want := range []float64{100e6, 20e6, 4e6} {
		approx(t, "eq1 M", res.CopiedBytes[i], want)
		approx(t, "eq2 Tc", res.CopyMs[i], want/1e5)
	}
	// Eq. 3: "T_cpi = T_cpf(i−1) + T_fw(i−1)" = 250 ms; eq. 5: "Tᵢ = T_cpi + T_ci":
	// 1250, 450, 290 ms.
	for i, want := range []float64{1250, 450, 290} {
		approx(t, "eq5 T", res.IterationMs[i], want)
	}
	// Eq. 4: "T_rt = T_fr + T_rtf" = 400 ms.
	approx(t, "eq4", res.RestoreMs, 400)
	// Eq. 6: "T_down = T_{i=n} + T_rt" = 290 + 400 = 690 ms.
	approx(t, "eq6", res.DowntimeMs, 690)
	// Eq. 7: "T_migrate = T_isync + Σ_{i=0}^{n} Tᵢ + T_rt" = 1000 + 1990 + 400 = 3390 ms.
	approx(t, "eq7", res.TotalMs, 3390)
	// n = 0 is stop-and-copy: the whole state is copied frozen.
	a.Iterations = 0
	approx(t, "eq6 n=0", a.Predict().DowntimeMs, 250+1000+400)
}

// TestPredictBaselines checks that Predict dispatches to the baselines.
func TestPredictBaselines(t *testing.T) {
	p := DefaultParams()
	in := Inputs{StateBytes: m100, DirtyRate: 1e4, BandwidthBps: gbit, Iterations: 1}
	pr, err := p.Predict(SotAModel, in)
	if err != nil {
		t.Fatal(err)
	}
	approx(t, "sota downtime", pr.DowntimeMs, 85.89934592)
	approx(t, "sota total", pr.TotalMs, 1148.04334592)

	pr, err = p.Predict(ARNABModel, in)
	if err != nil {
		t.Fatal(err)
	}
	want := ARNABFromParams(p, in).Predict()
	approx(t, "arnab downtime", pr.DowntimeMs, want.DowntimeMs)
	approx(t, "arnab total", pr.TotalMs, want.TotalMs)
	// The mapping: T_cpf = α1α2β = 161.28, T_fw = α1α2φᵈ = 76.8,
	// C_rate = 1.25·10⁸ B/s so T_c0 = 800 ms, M₁ = 10⁴·4096·0.8 B,
	// T_c1 = 262.144 ms, T_rt = 6.27·(60 + 80) = 877.8 ms:
	// downtime = 161.28 + 76.8 + 262.144 + 877.8 = 1378.024 ms.
	approx(t, "arnab mapped downtime", pr.DowntimeMs, 1378.024)
}

package model

import (
	"errors"
	"fmt"
	"math"
)

// This file is PAM (Calagna et al., Sec. VI, eqs. 13–34) at the paper's
// worst case: every iteration sees the same dirty rate R̂, given as the
// normalized rate r ∈ [0, 1] of Sec. VIII-A (0 = R_min, 1 = R_max).
// Quantities measured at two regimes in Table III are interpolated in r; the
// data volume of eq. 25 is interpolated as a whole (see DumpVolume).
// m is the state size M in bytes, l the bandwidth L in bit/s.

// ErrInfeasible reports a target that no bandwidth can meet: the processing
// time alone exceeds it.
var ErrInfeasible = errors.New("target cannot be met at any bandwidth")

// NetMs is T^net = V/L in ms for v bytes over l bit/s (Sec. VI-A).
func NetMs(v, l float64) float64 { return 8 * v / l * 1000 }

// PredumpFrozenMs is eq. 16 with eq. 18: T^{p,frozen}(M) = φᵖ + Γζ·M.
func (p Params) PredumpFrozenMs(m float64) float64 {
	return p.PhiPMs + p.GammaMsPerByte*p.Zeta*m
}

// DumpFrozenMs is eq. 17 with eq. 18: T^{d,frozen}(M,R) = φᵈ + Γξ(R)·M.
func (p Params) DumpFrozenMs(m, r float64) float64 {
	return p.PhiDMs + p.GammaMsPerByte*p.Xi.At(r)*m
}

// PredumpMemMs is eq. 19: T^{p,mem}(M) = δ + Λ·M.
func (p Params) PredumpMemMs(m float64) float64 { return p.DeltaMs + p.LambdaMsPerByte*m }

// DumpMemMs is eq. 20: T^{d,mem}(M,R) = δ + Λη(R)·M. It is part of the dump
// frozen time (eq. 4) and reported for Fig. 14 only.
func (p Params) DumpMemMs(m, r float64) float64 {
	return p.DeltaMs + p.LambdaMsPerByte*p.Eta.At(r)*m
}

// PredumpPages is eq. 22: Nᵖ(M) = μᵖ + νᵖ·M.
func (p Params) PredumpPages(m float64) float64 { return p.MuP + p.NuPPerByte*m }

// DumpPages is eq. 23: Nᵈ(M,R) = μᵈ + νᵈ(R)·M.
func (p Params) DumpPages(m, r float64) float64 { return p.MuD + p.NuD.At(r)*m }

// PredumpVolume is eq. 24: V₀(M) = ρ(τ₁·Nᵖ(M)·σ), ε omitted as in the paper.
func (p Params) PredumpVolume(m float64) float64 {
	return p.Rho * p.Tau1 * p.PredumpPages(m) * p.PageBytes
}

// DumpVolume is eq. 25: Vᵢ(M,R) = ρ(τ₂(R)·Nᵈ(M,R)·σ). Between the two
// measured regimes the volume itself is interpolated,
// (1−r)·V(R_min) + r·V(R_max), so that a quarter of the way to R_max moves
// a quarter of the way from 10 pages to the whole state.
func (p Params) DumpVolume(m, r float64) float64 {
	vmin := p.Rho * p.Tau2.Min * p.DumpPages(m, 0) * p.PageBytes
	vmax := p.Rho * p.Tau2.Max * p.DumpPages(m, 1) * p.PageBytes
	return (1-r)*vmin + r*vmax
}

// PredumpMs is eq. 13 with eq. 15: Tᵖ_podman = α1α2(β + T^{p,frozen} + T^{p,mem}).
func (p Params) PredumpMs(m float64) float64 {
	return p.ckpt() * (p.BetaMs + p.PredumpFrozenMs(m) + p.PredumpMemMs(m))
}

// DumpMs is eq. 14 with eq. 15: Tᵈ_podman = α1α2(β + T^{d,frozen}).
func (p Params) DumpMs(m, r float64) float64 {
	return p.ckpt() * (p.BetaMs + p.DumpFrozenMs(m, r))
}

// RestoreMs is eq. 26: Tʳ_podman ≈ α3α4(ψ + ω·M).
func (p Params) RestoreMs(m float64) float64 {
	return p.rest() * (p.PsiMs + p.OmegaMsPerByte*m)
}

// Iteration0Ms is eq. 27: T₀ = α1α2(β + T^{p,frozen} + T^{p,mem}) + T₀^net.
func (p Params) Iteration0Ms(m, l float64) float64 {
	return p.PredumpMs(m) + NetMs(p.PredumpVolume(m), l)
}

// IterationMs is eq. 28: Tᵢ = α1α2(β + T^{d,frozen}) + Tᵢ^net, i > 0.
func (p Params) IterationMs(m, r, l float64) float64 {
	return p.DumpMs(m, r) + NetMs(p.DumpVolume(m, r), l)
}

// DowntimeMs is eq. 29, the traditional procedure's downtime:
// α1α2(β + T^{d,frozen}) + T^net + α3α4·T^reloc.
func (p Params) DowntimeMs(m, r, l float64) float64 {
	return p.IterationMs(m, r, l) + p.RestoreMs(m)
}

// MigrationMs is eq. 30, the traditional procedure's total duration with I
// dump iterations between the predump and the final dump:
// T₀ + (I+1)·(α1α2(β + T^{d,frozen}) + T^net) + α3α4·T^reloc.
func (p Params) MigrationMs(m, r, l float64, iterations int) float64 {
	return p.Iteration0Ms(m, l) + float64(iterations+1)*p.IterationMs(m, r, l) + p.RestoreMs(m)
}

// COATAddMs is T^add_coat = T^ns_clear + T^ns_conf + T^flow (eq. 11, Table II).
func (p Params) COATAddMs() float64 { return p.NSClearMs + p.NSConfMs + p.FlowMs }

// COATDowntimeMs is eq. 31: eq. 29 plus the COAT steps.
func (p Params) COATDowntimeMs(m, r, l float64) float64 {
	return p.DowntimeMs(m, r, l) + p.COATAddMs()
}

// COATMigrationMs is eq. 32: eq. 30 plus the COAT steps.
func (p Params) COATMigrationMs(m, r, l float64, iterations int) float64 {
	return p.MigrationMs(m, r, l, iterations) + p.COATAddMs()
}

// COATProcessingDowntimeMs is eq. 31 without its network term,
// T^down_coat − T^net, which does not depend on L.
func (p Params) COATProcessingDowntimeMs(m, r float64) float64 {
	return p.DumpMs(m, r) + p.RestoreMs(m) + p.COATAddMs()
}

// RequiredBandwidth is eq. 33: the bandwidth (bit/s) above which the COAT
// downtime meets θ^down,
// L > V(M,R̂) / (θ^down − Tᵈ_podman(M,R̂) − Tʳ_podman(M) − T^add_coat).
// It returns ErrInfeasible when the denominator is not positive.
func (p Params) RequiredBandwidth(m, r, maxDowntimeMs float64) (float64, error) {
	den := maxDowntimeMs - p.COATProcessingDowntimeMs(m, r)
	if den <= 0 {
		return 0, fmt.Errorf("downtime %.0f ms: processing alone takes %.1f ms: %w",
			maxDowntimeMs, p.COATProcessingDowntimeMs(m, r), ErrInfeasible)
	}
	return 8 * p.DumpVolume(m, r) / (den / 1000), nil
}

// MaxIterations is eq. 34: the number of dump iterations I for which the
// COAT migration still fits θ^mig, T₀ + I·Tᵢ + T^down_coat ≤ θ^mig. The paper
// prints ⌈·⌉; ⌈·⌉ can overshoot θ^mig by one iteration, so this returns the
// floor, the largest I that meets the target. It returns ErrInfeasible when
// even I = 0 misses θ^mig.
func (p Params) MaxIterations(m, r, l, maxMigrationMs float64) (int, error) {
	num := maxMigrationMs - p.Iteration0Ms(m, l) - p.COATDowntimeMs(m, r, l)
	if num < 0 {
		return 0, fmt.Errorf("migration %.0f ms: predump and stop-and-copy alone take %.1f ms: %w",
			maxMigrationMs, maxMigrationMs-num, ErrInfeasible)
	}
	return int(math.Floor(num / p.IterationMs(m, r, l))), nil
}

package model

import (
	"errors"
	"fmt"
	"math"
)

// RatePair is a parameter PAM measures at its two dirty-page-rate regimes:
// Table III gives one value for R̂ = R_min and one for R̂ = R_max.
type RatePair struct {
	Min float64 `json:"min"` // value at R̂ = R_min
	Max float64 `json:"max"` // value at R̂ = R_max
}

// At returns the value at normalized dirty rate r ∈ [0, 1] (Sec. VIII-A),
// interpolating linearly between the two measured regimes.
func (p RatePair) At(r float64) float64 { return p.Min + r*(p.Max-p.Min) }

// Params is one parameter set of the model. The PAM fields carry the names
// and units of the paper's Table III; the edgehop fields extend it to the
// strategies edgehop runs. Times are in ms, sizes in bytes.
type Params struct {
	Name   string `json:"name"`
	Source string `json:"source"`

	// Layer factors (Observation 1): α1 Podman/runC and α2 runC/CRIU for
	// checkpoints (eqs. 13–14), α3 and α4 likewise for restore (eq. 26).
	Alpha1 float64 `json:"alpha1"`
	Alpha2 float64 `json:"alpha2"`
	Alpha3 float64 `json:"alpha3"`
	Alpha4 float64 `json:"alpha4"`

	PageBytes float64 `json:"page_bytes"` // σ
	BetaMs    float64 `json:"beta_ms"`    // β, freezing time (eq. 15)

	PhiPMs         float64  `json:"phi_p_ms"`          // φᵖ, predump frozen floor (eq. 16)
	PhiDMs         float64  `json:"phi_d_ms"`          // φᵈ, dump frozen floor (eq. 17)
	GammaMsPerByte float64  `json:"gamma_ms_per_byte"` // Γ (eq. 18)
	Zeta           float64  `json:"zeta"`              // ζ, γᵖ = Γζ
	Xi             RatePair `json:"xi"`                // ξ(R), γᵈ = Γξ(R)

	DeltaMs         float64  `json:"delta_ms"`           // δ (eqs. 19–20)
	LambdaMsPerByte float64  `json:"lambda_ms_per_byte"` // Λ
	Eta             RatePair `json:"eta"`                // η(R), 0 < η ≤ 1 (eq. 21)

	Tau1       float64  `json:"tau1"`          // τ₁, predump encapsulation (eq. 24)
	Tau2       RatePair `json:"tau2"`          // τ₂(R), dump encapsulation (eq. 25)
	MuP        float64  `json:"mu_p"`          // μᵖ, pages (eq. 22)
	MuD        float64  `json:"mu_d"`          // μᵈ, pages (eq. 23)
	NuPPerByte float64  `json:"nu_p_per_byte"` // νᵖ, pages per byte (eq. 22)
	NuD        RatePair `json:"nu_d_per_byte"` // νᵈ(R), pages per byte (eq. 23)

	PsiMs          float64 `json:"psi_ms"`            // ψ, restore floor (eq. 26)
	OmegaMsPerByte float64 `json:"omega_ms_per_byte"` // ω (eq. 26)

	Rho float64 `json:"rho"` // ρ, compressed/uncompressed volume without compression (eq. 2)

	// COAT steps 2, 4 and 5 (Table II).
	NSClearMs float64 `json:"ns_clear_ms"`
	NSConfMs  float64 `json:"ns_conf_ms"`
	FlowMs    float64 `json:"flow_ms"`

	// DirtyIntervalMs is DPRGen's ΔT: R_min is one page per ΔT and R_max is
	// ⌊M/σ⌋ pages per ΔT (Sec. IV-A).
	DirtyIntervalMs float64 `json:"dirty_interval_ms"`
	// DirtyRateMax, when positive, is the worst-case dirty rate (pages/s)
	// documented for this set (a fitted set: the largest rate sampled).
	// Zero means PAM's R_max = ⌊M/σ⌋/ΔT.
	DirtyRateMax float64 `json:"dirty_rate_max,omitempty"`

	// edgehop extensions.

	// SwitchMs is edgehop's network switch (COAT steps 2, 4, 5) during
	// downtime.
	SwitchMs float64 `json:"switch_ms"`
	// LiveReadMs + LiveReadMsPerByte·M is one live pre-copy round's cost of
	// reading and hashing the whole memory without freezing it.
	LiveReadMs        float64 `json:"live_read_ms"`
	LiveReadMsPerByte float64 `json:"live_read_ms_per_byte"`
	// DiffMsPerByte·M is the cost of finding, in the final dump, the pages
	// whose hash changed since the last live round.
	DiffMsPerByte float64 `json:"diff_ms_per_byte"`
	// LazyMsPerByte is the processing cost of a page pulled after a lazy
	// restore (read at the source plus install at the destination),
	// besides its network time.
	LazyMsPerByte float64 `json:"lazy_ms_per_byte"`
	// LocalInstallMsPerByte is the cost of installing a page that a hybrid
	// migration already copied to the destination.
	LocalInstallMsPerByte float64 `json:"local_install_ms_per_byte"`
	// LazyFixedMs is the fixed cost of the lazy phase (starting and
	// stopping the lazy-pages daemon and the page server).
	LazyFixedMs float64 `json:"lazy_fixed_ms,omitempty"`
	// LazyFaultMsPerPage is the extra cost of a page the service touches
	// before the background pull brought it: a fault served over the link.
	// The pages faulted are min(R·T_pull, pages), eq. 6's Nᵢ = R·T_{i−1}
	// with T_pull the lazy phase without faults.
	LazyFaultMsPerPage float64 `json:"lazy_fault_ms_per_page,omitempty"`
	// A transfer of V bytes over L bit/s takes NetFixedMs + RTT +
	// NetFactor·8V/L (PAM: T^net = V/L, i.e. 0 and 1).
	NetFixedMs float64 `json:"net_fixed_ms"`
	NetFactor  float64 `json:"net_factor"`
	// CompressRatio is ρ when compression is on; CompressMsPerByte the
	// compression cost per uncompressed byte.
	CompressRatio     float64 `json:"compress_ratio"`
	CompressMsPerByte float64 `json:"compress_ms_per_byte"`
	// Constant phases outside downtime.
	PrepareMs float64 `json:"prepare_ms"`
	CleanupMs float64 `json:"cleanup_ms"`
}

// DefaultName names the parameter set DefaultParams returns.
const DefaultName = "pam-table-iii"

// DefaultParams returns the PAM parameters of Tables II and III (Calagna et
// al.), and edgehop's extensions derived from them:
//   - SwitchMs is the sum of Table II (69 + 101 + 71 = 241 ms);
//   - a live round reads memory as predump's memory time does (eq. 19:
//     δ + Λ·M) without predump's freezing and frozen time;
//   - finding the final delta costs Λ per byte;
//   - a lazily pulled byte costs what the eager path pays for it: dumping it
//     at R_max (α1α2·Γξ(R_max)) plus relocating it (α3α4·ω); a byte already
//     at the destination costs only the relocation;
//   - compression ratio 1 (the paper's states are random and incompressible)
//     and 2·10⁻⁶ ms/B (500 MB/s) compression cost, an edgehop assumption.
func DefaultParams() Params {
	p := Params{
		Name:   DefaultName,
		Source: "Calagna et al., PAM Tables II and III; edgehop extensions derived from them",

		Alpha1: 1.6, Alpha2: 1.2, Alpha3: 3.3, Alpha4: 1.9,
		PageBytes: 4096,
		BetaMs:    84,

		PhiPMs: 6.0, PhiDMs: 40,
		GammaMsPerByte: 1e-7,
		Zeta:           1.0,
		Xi:             RatePair{Min: 0, Max: 30},

		DeltaMs:         1.8,
		LambdaMsPerByte: 3e-6,
		Eta:             RatePair{Min: 0.0075, Max: 0.75},

		Tau1:       1.0,
		Tau2:       RatePair{Min: 4.0, Max: 1.0}, // τ₂(R_max) = τ₁
		MuP:        45,
		MuD:        10,
		NuPPerByte: 2.5e-4,
		NuD:        RatePair{Min: 0, Max: 2.5e-4}, // νᵈ(R_max) = νᵖ

		PsiMs: 60, OmegaMsPerByte: 8e-7,
		Rho: 1.0,

		NSClearMs: 69, NSConfMs: 101, FlowMs: 71,

		DirtyIntervalMs: 1000, // Fig. 7: ΔT = 1 s

		NetFactor:         1,
		CompressRatio:     1,
		CompressMsPerByte: 2e-6,
	}
	p.DeriveExtensions()
	return p
}

// DeriveExtensions sets the edgehop extension parameters from the PAM ones,
// as DefaultParams documents. Fitting calls it before overriding what the
// samples measure.
func (p *Params) DeriveExtensions() {
	p.SwitchMs = p.COATAddMs()
	p.LiveReadMs = p.DeltaMs
	p.LiveReadMsPerByte = p.LambdaMsPerByte
	p.DiffMsPerByte = p.LambdaMsPerByte
	p.LazyMsPerByte = p.ckpt()*p.GammaMsPerByte*p.Xi.Max + p.rest()*p.OmegaMsPerByte
	p.LocalInstallMsPerByte = p.rest() * p.OmegaMsPerByte
}

// ErrInvalidParams reports a parameter set the model cannot use.
var ErrInvalidParams = errors.New("invalid model parameters")

// Validate checks the parameter set. Each check is small; the first failure
// is returned wrapped in ErrInvalidParams.
func (p Params) Validate() error {
	checks := []struct {
		ok  bool
		msg string
	}{
		{p.Alpha1 > 0 && p.Alpha2 > 0 && p.Alpha3 > 0 && p.Alpha4 > 0, "layer factors α1..α4 must be positive"},
		{p.PageBytes > 0, "page size σ must be positive"},
		{p.Eta.Min > 0 && p.Eta.Min <= 1 && p.Eta.Max > 0 && p.Eta.Max <= 1, "eq. 21 requires 0 < η(R) ≤ 1"},
		{p.Rho > 0 && p.Rho <= 1, "ρ must be in (0, 1]"},
		{p.CompressRatio > 0 && p.CompressRatio <= 1, "compress ratio must be in (0, 1]"},
		{p.NetFactor > 0, "net factor must be positive"},
		{p.DirtyIntervalMs > 0, "dirty interval ΔT must be positive"},
		{p.Tau1 > 0 && p.Tau2.Min > 0 && p.Tau2.Max > 0, "encapsulation factors τ must be positive"},
	}
	for _, c := range checks {
		if !c.ok {
			return fmt.Errorf("%w: %s", ErrInvalidParams, c.msg)
		}
	}
	nonneg := map[string]float64{
		"beta": p.BetaMs, "phi_p": p.PhiPMs, "phi_d": p.PhiDMs, "gamma": p.GammaMsPerByte,
		"zeta": p.Zeta, "xi.min": p.Xi.Min, "xi.max": p.Xi.Max, "delta": p.DeltaMs,
		"lambda": p.LambdaMsPerByte, "mu_p": p.MuP, "mu_d": p.MuD, "nu_p": p.NuPPerByte,
		"nu_d.min": p.NuD.Min, "nu_d.max": p.NuD.Max, "psi": p.PsiMs, "omega": p.OmegaMsPerByte,
		"switch": p.SwitchMs, "live_read": p.LiveReadMs, "live_read_per_byte": p.LiveReadMsPerByte,
		"diff": p.DiffMsPerByte, "lazy": p.LazyMsPerByte, "local_install": p.LocalInstallMsPerByte,
		"lazy_fixed": p.LazyFixedMs, "lazy_fault": p.LazyFaultMsPerPage,
		"net_fixed": p.NetFixedMs, "compress_cost": p.CompressMsPerByte,
		"prepare": p.PrepareMs, "cleanup": p.CleanupMs, "dirty_rate_max": p.DirtyRateMax,
		"ns_clear": p.NSClearMs, "ns_conf": p.NSConfMs, "flow": p.FlowMs,
	}
	for _, k := range sortedKeys(nonneg) {
		if v := nonneg[k]; v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: %s = %v must be finite and non-negative", ErrInvalidParams, k, v)
		}
	}
	return nil
}

// MinDirtyRate is PAM's R_min: one page per ΔT, in pages/s.
func (p Params) MinDirtyRate() float64 { return 1000 / p.DirtyIntervalMs }

// MaxDirtyRate is the worst-case dirty rate of this set for state size M,
// in pages/s: DirtyRateMax when set, else PAM's R_max = ⌊M/σ⌋/ΔT.
func (p Params) MaxDirtyRate(m float64) float64 {
	if p.DirtyRateMax > 0 {
		return p.DirtyRateMax
	}
	return math.Floor(m/p.PageBytes) * 1000 / p.DirtyIntervalMs
}

// NormalizedRate maps a dirty rate R (pages/s) to Sec. VIII-A's
// r = (R̂ − R_min)/(R_max − R_min), clamped to [0, 1].
func (p Params) NormalizedRate(m, rate float64) float64 {
	lo, hi := p.MinDirtyRate(), p.MaxDirtyRate(m)
	if hi <= lo {
		if rate >= hi {
			return 1
		}
		return 0
	}
	return clamp01((rate - lo) / (hi - lo))
}

func (p Params) ckpt() float64 { return p.Alpha1 * p.Alpha2 }
func (p Params) rest() float64 { return p.Alpha3 * p.Alpha4 }

func clamp01(x float64) float64 { return math.Max(0, math.Min(1, x)) }

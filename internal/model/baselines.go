package model

import "math"

// SotA is the state-of-the-art model PAM is compared with (He et al., the
// paper's ref. [4], as described in Sec. VII-B): "the duration of each
// iteration consists of the network transfer time only", so the pages to
// send shrink geometrically. Iteration 0 sends the state M; iteration i
// sends the pages dirtied while iteration i−1 was on the wire, at most M;
// the final iteration I+1 is the downtime.
type SotA struct {
	StateBytes   float64 // M
	DirtyRate    float64 // R, pages/s
	PageBytes    float64 // σ
	BandwidthBps float64 // L
	Iterations   int     // I
}

// SotAResult is the SotA prediction, with every iteration's volume.
type SotAResult struct {
	VolumesBytes []float64 `json:"volumes_bytes"` // V₀ … V_{I+1}
	DowntimeMs   float64   `json:"downtime_ms"`   // V_{I+1}/L
	TotalMs      float64   `json:"total_ms"`      // Σ_{i=0}^{I+1} Vᵢ/L
}

// Predict evaluates the SotA recursion Vᵢ = min(R·σ·V_{i−1}/L, M).
func (s SotA) Predict() SotAResult {
	var res SotAResult
	v := s.StateBytes
	for i := 0; i <= s.Iterations+1; i++ {
		if i > 0 {
			v = math.Min(s.DirtyRate*s.PageBytes*NetMs(v, s.BandwidthBps)/1000, s.StateBytes)
		}
		res.VolumesBytes = append(res.VolumesBytes, v)
		res.TotalMs += NetMs(v, s.BandwidthBps)
	}
	res.DowntimeMs = NetMs(v, s.BandwidthBps)
	return res
}

// ARNAB is the pre-copy downtime model of Abdullaziz et al. (eqs. 1–7).
// Iteration n is the frozen one; iterations 0 … n−1 run live.
type ARNAB struct {
	InitBytes      float64 // M_init, the state copied at i = 0
	DirtyBps       float64 // D_rate, bytes dirtied per second
	CopyBps        float64 // C_rate, bytes copied per second
	CheckpointMs   float64 // T_cpf, executing the checkpoint function
	FileWriteMs    float64 // T_fw, writing the process tree and resources
	RestoreFuncMs  float64 // T_fr, executing the restore function
	RestoreFilesMs float64 // T_rtf, reading the checkpoint files
	ImageSyncMs    float64 // T_isync, container image synchronisation
	Iterations     int     // n
}

// ARNABResult is ARNAB's prediction with every iteration's terms.
type ARNABResult struct {
	CopiedBytes []float64 `json:"copied_bytes"` // M_i
	CopyMs      []float64 `json:"copy_ms"`      // T_ci
	IterationMs []float64 `json:"iteration_ms"` // T_i
	RestoreMs   float64   `json:"restore_ms"`   // T_rt
	DowntimeMs  float64   `json:"downtime_ms"`  // eq. 6
	TotalMs     float64   `json:"total_ms"`     // eq. 7
}

// Predict evaluates eqs. 1–7. Eq. 1's M_i = D_rate·T_c(i−1) is capped at
// M_init: a container cannot dirty more memory than it has.
func (a ARNAB) Predict() ARNABResult {
	var res ARNABResult
	checkpoint := a.CheckpointMs + a.FileWriteMs       // eq. 3, the same every iteration
	res.RestoreMs = a.RestoreFuncMs + a.RestoreFilesMs // eq. 4
	res.TotalMs = a.ImageSyncMs
	for i := 0; i <= a.Iterations; i++ {
		mi := a.InitBytes // eq. 1, i = 0
		if i > 0 {
			mi = math.Min(a.DirtyBps*res.CopyMs[i-1]/1000, a.InitBytes)
		}
		tc := mi / a.CopyBps * 1000 // eq. 2
		ti := checkpoint + tc       // eq. 5
		res.CopiedBytes = append(res.CopiedBytes, mi)
		res.CopyMs = append(res.CopyMs, tc)
		res.IterationMs = append(res.IterationMs, ti)
		res.TotalMs += ti
	}
	res.DowntimeMs = res.IterationMs[a.Iterations] + res.RestoreMs // eq. 6
	res.TotalMs += res.RestoreMs                                   // eq. 7
	return res
}

// ARNABFromParams maps a parameter set onto ARNAB's terms so the two models
// can be compared on the same inputs: T_cpf is the layered freeze
// α1α2·β, T_fw the layered dump floor α1α2·φᵈ, T_fr the layered restore
// floor α3α4·ψ, T_rtf the layered relocation α3α4·ω·M, C_rate = L/8,
// D_rate = R·σ and T_isync the prepare phase.
func ARNABFromParams(p Params, in Inputs) ARNAB {
	return ARNAB{
		InitBytes:      in.StateBytes,
		DirtyBps:       in.DirtyRate * p.PageBytes,
		CopyBps:        in.BandwidthBps / 8,
		CheckpointMs:   p.ckpt() * p.BetaMs,
		FileWriteMs:    p.ckpt() * p.PhiDMs,
		RestoreFuncMs:  p.rest() * p.PsiMs,
		RestoreFilesMs: p.rest() * p.OmegaMsPerByte * in.StateBytes,
		ImageSyncMs:    p.PrepareMs,
		Iterations:     in.Iterations,
	}
}

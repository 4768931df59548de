package model

import "fmt"

// UAV is the autopilot-migration example of Sec. VIII-B with its Table IV
// parameters.
type UAV struct {
	SafetyDistanceM float64 `json:"safety_distance_m"` // D*_s
	MassKg          float64 `json:"mass_kg"`           // m_UAV
	BrakeForceN     float64 `json:"brake_force_n"`     // F_b
	VideoLatencyMs  float64 `json:"video_latency_ms"`  // T^v
	ProcMs          float64 `json:"proc_ms"`           // T^proc
	StateBytes      float64 `json:"state_bytes"`       // M of the autopilot MS
	NormalizedRate  float64 `json:"normalized_rate"`   // r of the autopilot MS
}

// DefaultUAV returns Table IV: D*_s = 30 m, m_UAV = 3 kg, F_b = 5 N,
// T^v = 30 ms, r = 0.25, M = 20 MB, T^proc = 10 ms. MB is 10⁶ bytes.
func DefaultUAV() UAV {
	return UAV{SafetyDistanceM: 30, MassKg: 3, BrakeForceN: 5, VideoLatencyMs: 30, ProcMs: 10,
		StateBytes: 20e6, NormalizedRate: 0.25}
}

// ReactionDistance is eq. 35: D_r(v) = v·(T^down_coat + T^v + T^proc), in m
// for v in m/s and the downtime in ms.
func (u UAV) ReactionDistance(v, downtimeMs float64) float64 {
	return v * (downtimeMs + u.VideoLatencyMs + u.ProcMs) / 1000
}

// BrakingDistance is eq. 36: D_b(v) = v²·m_UAV/(2·F_b), in m.
func (u UAV) BrakingDistance(v float64) float64 {
	return v * v * u.MassKg / (2 * u.BrakeForceN)
}

// StoppingDistance is D_s(v) = D_r(v) + D_b(v) for a COAT downtime
// predicted by PAM (eq. 31) at bandwidth l.
func (u UAV) StoppingDistance(p Params, v, l float64) float64 {
	return u.ReactionDistance(v, p.COATDowntimeMs(u.StateBytes, u.NormalizedRate, l)) + u.BrakingDistance(v)
}

// RequiredBandwidth is eq. 37: the bandwidth (bit/s) between the edge
// servers for which the stopping distance at speed v (m/s) stays within
// D*_s,
// L ≥ v·V(M,R̂) / (D*_s − D_b(v) − v·(T^v + T^proc + T^down_coat − T^net)).
// It returns ErrInfeasible when the denominator is not positive: braking
// and processing alone use up the safety distance.
func (u UAV) RequiredBandwidth(p Params, v float64) (float64, error) {
	procMs := p.COATProcessingDowntimeMs(u.StateBytes, u.NormalizedRate)
	den := u.SafetyDistanceM - u.BrakingDistance(v) - v*(u.VideoLatencyMs+u.ProcMs+procMs)/1000
	if den <= 0 {
		return 0, fmt.Errorf("uav at %.2f m/s: braking %.2f m and reaction without transfer %.2f m exceed %.0f m: %w",
			v, u.BrakingDistance(v), v*(u.VideoLatencyMs+u.ProcMs+procMs)/1000, u.SafetyDistanceM, ErrInfeasible)
	}
	return v * 8 * p.DumpVolume(u.StateBytes, u.NormalizedRate) / den, nil
}

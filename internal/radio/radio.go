package radio

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/edgehop/edgehop/internal/topo"
)

// Model is a log-distance path-loss model with a handoff policy.
type Model struct {
	TxPowerDBm   float64 `json:"tx_power_dbm"`  // the device's transmit power
	RefLossDB    float64 `json:"ref_loss_db"`   // loss at the reference distance (1 m)
	Exponent     float64 `json:"exponent"`      // path-loss exponent: 2 free space, 2.7-3.5 urban
	ThresholdDBm float64 `json:"threshold_dbm"` // below it the serving AP asks for a handoff
	HysteresisDB float64 `json:"hysteresis_db"` // a candidate must beat the serving AP by this much
	FloorDBm     float64 `json:"floor_dbm"`     // below it an AP does not hear the device at all
}

// DefaultModel: 20 dBm device, 40 dB at 1 m, exponent 3 (-80 dBm at
// 100 m), handoff below -75 dBm to an AP at least 6 dB better, nothing
// heard below -100 dBm (about 460 m).
func DefaultModel() Model {
	return Model{TxPowerDBm: 20, RefLossDB: 40, Exponent: 3, ThresholdDBm: -75, HysteresisDB: 6, FloorDBm: -100}
}

// Validate checks the parameters.
func (m Model) Validate() error {
	var errs []error
	if m.Exponent < 1 || m.Exponent > 6 {
		errs = append(errs, fmt.Errorf("path-loss exponent %v outside 1..6", m.Exponent))
	}
	if m.HysteresisDB < 0 {
		errs = append(errs, fmt.Errorf("hysteresis %v dB < 0", m.HysteresisDB))
	}
	if m.FloorDBm >= m.ThresholdDBm {
		errs = append(errs, fmt.Errorf("floor %v dBm must be below the threshold %v dBm", m.FloorDBm, m.ThresholdDBm))
	}
	return errors.Join(errs...)
}

// RSSI is the signal an AP at distance d metres hears the device with.
func (m Model) RSSI(d float64) float64 {
	if d < 1 {
		d = 1
	}
	return m.TxPowerDBm - m.RefLossDB - 10*m.Exponent*math.Log10(d)
}

// Heard is one AP's reading.
type Heard struct {
	AP   string  `json:"ap"`
	RSSI float64 `json:"rssi_dbm"`
}

// Range is the distance beyond which no AP hears the device (the floor).
func (m Model) Range() float64 {
	return math.Pow(10, (m.TxPowerDBm-m.RefLossDB-m.FloorDBm)/(10*m.Exponent))
}

// Scan lists what the access points aps hear of a device at p, strongest
// first; APs below the floor are left out.
func (m Model) Scan(aps []topo.AP, p topo.Point) []Heard {
	var out []Heard
	for _, a := range aps {
		r := m.RSSI(topo.Dist(a.Pos, p))
		if r >= m.FloorDBm {
			out = append(out, Heard{AP: a.Name, RSSI: r})
		}
	}
	slices.SortStableFunc(out, func(a, b Heard) int { return cmp.Compare(b.RSSI, a.RSSI) })
	return out
}

// Decision is a tier-1 verdict for one device.
type Decision struct {
	Handoff bool    `json:"handoff"`
	From    string  `json:"from"`
	To      string  `json:"to"`
	RSSI    float64 `json:"rssi_dbm"`    // at the serving AP
	ToRSSI  float64 `json:"to_rssi_dbm"` // at the chosen AP
	Reason  string  `json:"reason"`
}

// Decide is the controller's handoff decision for a device at p served by
// AP serving ("" when not attached): attach to the strongest AP; hand off
// only when the serving AP hears it below the threshold (or not at all)
// and a candidate is better by the hysteresis margin.
func (m Model) Decide(t topo.Topology, serving string, p topo.Point) Decision {
	return m.DecideAmong(t.APs, t.AP, serving, p)
}

// DecideAmong is Decide with the candidate access points given (those in
// range, from a spatial index) and a lookup of the serving one.
func (m Model) DecideAmong(cands []topo.AP, lookup func(string) (topo.AP, bool), serving string, p topo.Point) Decision {
	// The strongest candidate heard (the first of Scan's order), without
	// building the scan.
	best, heard := Heard{RSSI: math.Inf(-1)}, false
	for _, a := range cands {
		if r := m.RSSI(topo.Dist(a.Pos, p)); r >= m.FloorDBm && (r > best.RSSI || (r == best.RSSI && !heard)) {
			best, heard = Heard{AP: a.Name, RSSI: r}, true
		}
	}
	if !heard {
		return Decision{From: serving, Reason: "no access point hears the device"}
	}
	if serving == "" {
		return Decision{Handoff: true, To: best.AP, ToRSSI: best.RSSI, RSSI: math.Inf(-1), Reason: "attach to the strongest access point"}
	}
	cur := math.Inf(-1)
	if a, ok := lookup(serving); ok {
		cur = m.RSSI(topo.Dist(a.Pos, p))
	}
	d := Decision{From: serving, RSSI: cur, To: serving}
	switch {
	case cur >= m.ThresholdDBm:
		d.Reason = fmt.Sprintf("serving signal %.1f dBm at or above the threshold %.1f dBm", cur, m.ThresholdDBm)
	case best.AP == serving:
		d.Reason = "the serving access point is still the strongest"
	case best.RSSI < cur+m.HysteresisDB && cur >= m.FloorDBm:
		d.Reason = fmt.Sprintf("best candidate %s at %.1f dBm is not %.0f dB above the serving %.1f dBm", best.AP, best.RSSI, m.HysteresisDB, cur)
	default:
		d.Handoff, d.To, d.ToRSSI = true, best.AP, best.RSSI
		d.Reason = fmt.Sprintf("serving signal %.1f dBm below the threshold %.1f dBm; %s hears %.1f dBm", cur, m.ThresholdDBm, best.AP, best.RSSI)
	}
	return d
}

package model

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// DirtyRate is a resolved dirty-rate specification.
type DirtyRate struct {
	Spec           string  `json:"spec"`             // as given: "max", "min", "r=0.25" or pages/s
	PagesPerSecond float64 `json:"pages_per_second"` // R
	Normalized     float64 `json:"normalized"`       // PAM's r for this R and M
	Note           string  `json:"note"`             // what the value is and where it comes from
}

// ResolveDirtyRate turns a specification into a rate for state size m:
// "max" is the worst case of the parameter set (PAM: R_max), "min" is
// R_min, "r=X" is the normalized rate X ∈ [0, 1] of Sec. VIII-A, and a
// plain number is pages per second.
func ResolveDirtyRate(p Params, m float64, spec string) (DirtyRate, error) {
	d := DirtyRate{Spec: spec}
	lo, hi := p.MinDirtyRate(), p.MaxDirtyRate(m)
	s := strings.ToLower(strings.TrimSpace(spec))
	switch {
	case s == "max":
		d.PagesPerSecond = hi
		if p.DirtyRateMax > 0 {
			d.Note = fmt.Sprintf("worst case of parameter set %q: %.0f pages/s, the largest rate it was fitted on", p.Name, hi)
		} else {
			d.Note = fmt.Sprintf("PAM worst case R̂ = R_max = ⌊M/σ⌋/ΔT = %.0f pages/s (Table III column R_max: DPRGen rewrites every page of the state once per ΔT = %.0f ms)", hi, p.DirtyIntervalMs)
		}
	case s == "min":
		d.PagesPerSecond = lo
		d.Note = fmt.Sprintf("PAM best case R̂ = R_min = 1 page per ΔT = %.3g pages/s", lo)
	case strings.HasPrefix(s, "r="):
		r, err := strconv.ParseFloat(strings.TrimPrefix(s, "r="), 64)
		if err != nil || r < 0 || r > 1 {
			return DirtyRate{}, fmt.Errorf("%w: dirty rate %q: r must be in [0, 1]", ErrInvalidInputs, spec)
		}
		d.PagesPerSecond = lo + r*(hi-lo)
		d.Note = fmt.Sprintf("normalized rate r = %g between R_min and R_max (Sec. VIII-A)", r)
	default:
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 {
			return DirtyRate{}, fmt.Errorf("%w: dirty rate %q: want max, min, r=X or pages per second", ErrInvalidInputs, spec)
		}
		d.PagesPerSecond = v
		d.Note = "pages per second as given"
	}
	d.Normalized = p.NormalizedRate(m, d.PagesPerSecond)
	return d, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

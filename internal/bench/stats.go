package bench

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of one measurement over the runs, in the
// unit its field name says (milliseconds, bytes).
type Summary struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Summarize returns the p50, p99 and maximum of xs. Percentiles
// interpolate linearly between the closest ranks (the "linear" method of
// numpy and R type 7): with 10 runs the p50 is the mean of the 5th and 6th
// smallest values. An empty xs gives the zero Summary.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return Summary{P50: percentile(s, 0.50), P99: percentile(s, 0.99), Max: s[len(s)-1]}
}

// percentile returns the q-quantile (0..1) of sorted s.
func percentile(s []float64, q float64) float64 {
	if len(s) == 1 {
		return s[0]
	}
	h := q * float64(len(s)-1)
	lo := int(math.Floor(h))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[lo] + (h-float64(lo))*(s[lo+1]-s[lo])
}

// Ratio returns baseline ÷ edgehop, or nil when either is not a positive
// measurement (a ratio of something unmeasured is not reported).
func Ratio(baseline, edgehop float64) *float64 {
	if !(baseline > 0) || !(edgehop > 0) || math.IsInf(baseline, 0) || math.IsInf(edgehop, 0) {
		return nil
	}
	r := baseline / edgehop
	return &r
}

// ms converts a duration to float milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

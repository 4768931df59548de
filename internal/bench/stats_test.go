package bench

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want Summary
	}{
		{"empty", nil, Summary{}},
		{"one", []float64{7}, Summary{P50: 7, P99: 7, Max: 7}},
		{"two", []float64{10, 20}, Summary{P50: 15, P99: 19.9, Max: 20}},
		{"odd, unsorted", []float64{5, 1, 3}, Summary{P50: 3, P99: 4.96, Max: 5}},
		// numpy.percentile(range(1, 11), [50, 99]) = [5.5, 9.91]
		{"ten", []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, Summary{P50: 5.5, P99: 9.91, Max: 10}},
		{"equal", []float64{4, 4, 4, 4}, Summary{P50: 4, P99: 4, Max: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Summarize(tt.in)
			if !near(got.P50, tt.want.P50) || !near(got.P99, tt.want.P99) || got.Max != tt.want.Max {
				t.Fatalf("Summarize(%v) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestSummarizeDoesNotReorderInput(t *testing.T) {
	in := []float64{3, 1, 2}
	Summarize(in)
	if in[0] != 3 || in[1] != 1 || in[2] != 2 {
		t.Fatalf("input changed to %v", in)
	}
}

func TestRatio(t *testing.T) {
	tests := []struct {
		baseline, edgehop float64
		want              float64 // NaN: nil
	}{
		{1000, 40, 25},
		{40, 40, 1},
		{30, 60, 0.5},
		{1000, 0, math.NaN()}, // edgehop gap not measured
		{0, 40, math.NaN()},   // baseline not measured
		{-1, 40, math.NaN()},
		{math.Inf(1), 40, math.NaN()},
		{math.NaN(), 40, math.NaN()},
	}
	for _, tt := range tests {
		got := Ratio(tt.baseline, tt.edgehop)
		switch {
		case math.IsNaN(tt.want) && got != nil:
			t.Errorf("Ratio(%v, %v) = %v, want nil", tt.baseline, tt.edgehop, *got)
		case !math.IsNaN(tt.want) && (got == nil || !near(*got, tt.want)):
			t.Errorf("Ratio(%v, %v) = %v, want %v", tt.baseline, tt.edgehop, got, tt.want)
		}
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

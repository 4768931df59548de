package linkemu

import "testing"

func TestTBFSizes(t *testing.T) {
	for _, tc := range []struct {
		rate         uint64
		burst, limit uint32
	}{
		{1_000_000_000, 256 << 10, 2_500_000},
		{300_000_000, 128 << 10, 750_000},
		{100_000_000, 72 << 10, 250_000},
		{10_000_000, 72 << 10, 144 << 10},
		{MinRate, 72 << 10, 144 << 10},
		{10_000_000_000, 39 * 64 << 10, 25_000_000},
	} {
		burst, limit := TBFSizes(tc.rate)
		if burst != tc.burst || limit != tc.limit {
			t.Errorf("TBFSizes(%d) = %d, %d; want %d, %d", tc.rate, burst, limit, tc.burst, tc.limit)
		}
		if burst < gsoMax || limit < 2*gsoMax {
			t.Errorf("TBFSizes(%d) = %d, %d: too small for whole GSO packets", tc.rate, burst, limit)
		}
	}
}

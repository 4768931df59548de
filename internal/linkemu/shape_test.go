package linkemu

import "testing"

func TestTBFSizes(t *testing.T) {
	for _, tc := range []struct {
		rate         uint64
		burst, limit uint32
	}{
		{1_000_000_000, 256 << 10, 256<<10 + 2_500_000},
		{100_000_000, 25_000, 25_000 + 250_000},
		{10_000_000, 16 * 1514, 16*1514 + 2*gsoMax},
		{MinRate, 16 * 1514, 16*1514 + 2*gsoMax},
		{10_000_000_000, 2_500_000 + 64<<10 - 2_500_000%(64<<10), 0},
	} {
		burst, limit := TBFSizes(tc.rate)
		if burst != tc.burst || (tc.limit != 0 && limit != tc.limit) {
			t.Errorf("TBFSizes(%d) = %d, %d; want %d, %d", tc.rate, burst, limit, tc.burst, tc.limit)
		}
		if limit < burst+2*gsoMax {
			t.Errorf("TBFSizes(%d): limit %d has no room for two GSO packets past the burst", tc.rate, limit)
		}
	}
}

package units

import "testing"

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		bad  bool
	}{
		{"1gbit", 1e9, false}, {"100mbit", 1e8, false}, {"350Mbit", 35e7, false}, {"10kbit", 1e4, false},
		{"1000", 1000, false}, {"1.5gbit", 15e8, false}, {"125mbps", 1e9, false}, {"fast", 0, true}, {"-1mbit", 0, true},
	} {
		got, err := ParseRate(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
		if !tc.bad && tc.want%1000 == 0 {
			back, err := ParseRate(FormatRate(got))
			if err != nil || back != got {
				t.Errorf("FormatRate round trip of %d: %q -> %d, %v", got, FormatRate(got), back, err)
			}
		}
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"200MB", 200e6, false}, {"1GiB", 1 << 30, false}, {"4096", 4096, false}, {"10m", 10 << 20, false}, {"x", 0, true},
	} {
		got, err := ParseSize(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 66100: "66.1 kB", 1_200_000_000: "1.20 GB", 5_500_000: "5.5 MB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

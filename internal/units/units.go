// Package units parses and formats the quantities users type: link rates
// ("1gbit", "100Mbit", "350mbit") and byte sizes ("200MB", "1.2GiB").
// It is pure and has no dependencies.
package units

import (
	"fmt"
	"strconv"
	"strings"
)

var rateSuffixes = []struct {
	s string
	m float64
}{
	{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
	{"gbps", 8e9}, {"mbps", 8e6}, {"kbps", 8e3}, {"bps", 8},
}

// ParseRate parses a rate in bits per second: a number with an optional
// tc-style suffix (kbit, mbit, gbit; kbps/mbps/gbps mean bytes per second).
func ParseRate(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, suf := range rateSuffixes {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSuffix(t, suf.s), suf.m
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("rate %q: want a number with kbit/mbit/gbit, e.g. 100mbit", s)
	}
	return uint64(v * mult), nil
}

// FormatRate renders bits per second the way ParseRate reads it.
func FormatRate(bps uint64) string {
	switch {
	case bps == 0:
		return "unlimited"
	case bps%1_000_000_000 == 0:
		return fmt.Sprintf("%dgbit", bps/1_000_000_000)
	case bps%1_000_000 == 0:
		return fmt.Sprintf("%dmbit", bps/1_000_000)
	case bps%1000 == 0:
		return fmt.Sprintf("%dkbit", bps/1000)
	}
	return fmt.Sprintf("%dbit", bps)
}

var sizeSuffixes = []struct {
	s string
	m float64
}{
	{"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10},
	{"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}, {"b", 1},
}

// ParseSize parses a byte size such as 200MB, 1.2GiB or 4096.
func ParseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := 1.0
	for _, suf := range sizeSuffixes {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSuffix(t, suf.s), suf.m
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit, e.g. 200MB", s)
	}
	return int64(v * mult), nil
}

// FormatSize writes a byte count with a decimal unit: 512 B, 66.1 kB,
// 1.20 GB.
func FormatSize(n int64) string {
	f := float64(n)
	switch {
	case n < 1000:
		return fmt.Sprintf("%d B", n)
	case f < 1e6:
		return fmt.Sprintf("%.1f kB", f/1e3)
	case f < 1e9:
		return fmt.Sprintf("%.1f MB", f/1e6)
	}
	return fmt.Sprintf("%.2f GB", f/1e9)
}

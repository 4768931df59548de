package workload

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// PageSize is σ, the page size of the paper and of the machines here.
const PageSize = 4096

// StampSize is the part of a page a write replaces: the write version
// (8 bytes, little endian) followed by pseudo-random bytes derived from
// (seed, page, version). The rest of the page is random content fixed by
// (seed, page) at allocation, so the state does not compress.
const StampSize = 64

// splitmix64 is the SplitMix64 step: it advances *x and returns the next
// 64-bit output. It is the generator of every page's bytes.
func splitmix64(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// mix derives a stream seed from its parts.
func mix(parts ...uint64) uint64 {
	var s uint64 = 0x6a09e667f3bcc909
	for _, p := range parts {
		s ^= p
		s = splitmix64(&s)
	}
	return s
}

const (
	tagBody  = 0x626f6479 // "body"
	tagStamp = 0x7374616d // "stam"
)

// FillPage writes the whole content of page index at version into dst
// (PageSize bytes): the body fixed by (seed, index) and the stamp of
// version.
func FillPage(dst []byte, seed uint64, index int, version uint32) {
	_ = dst[PageSize-1]
	s := mix(seed, uint64(index), tagBody)
	for off := StampSize; off < PageSize; off += 8 {
		binary.LittleEndian.PutUint64(dst[off:], splitmix64(&s))
	}
	WriteStamp(dst, seed, index, version)
}

// WriteStamp replaces the stamp of page index with the one of version:
// what one write of DPRGen changes.
func WriteStamp(dst []byte, seed uint64, index int, version uint32) {
	_ = dst[StampSize-1]
	binary.LittleEndian.PutUint64(dst, uint64(version))
	s := mix(seed, uint64(index), uint64(version), tagStamp)
	for off := 8; off < StampSize; off += 8 {
		binary.LittleEndian.PutUint64(dst[off:], splitmix64(&s))
	}
}

// CheckPage reports whether src (PageSize bytes) is exactly the content
// FillPage gives for (seed, index, version).
func CheckPage(src []byte, seed uint64, index int, version uint32) bool {
	_ = src[PageSize-1]
	if binary.LittleEndian.Uint64(src) != uint64(version) {
		return false
	}
	s := mix(seed, uint64(index), uint64(version), tagStamp)
	for off := 8; off < StampSize; off += 8 {
		if binary.LittleEndian.Uint64(src[off:]) != splitmix64(&s) {
			return false
		}
	}
	s = mix(seed, uint64(index), tagBody)
	for off := StampSize; off < PageSize; off += 8 {
		if binary.LittleEndian.Uint64(src[off:]) != splitmix64(&s) {
			return false
		}
	}
	return true
}

// Pages is the number of whole pages in a state of stateBytes: ⌊M/σ⌋.
func Pages(stateBytes int64) int {
	if stateBytes <= 0 {
		return 0
	}
	return int(stateBytes / PageSize)
}

// HotPages is the number of pages a dirty fraction f ∈ (0, 1] of pages
// rewrites (ARNAB's "20% of the state frequently changes"): ⌈f·pages⌉,
// at least 1. f = 0 means the whole state.
func HotPages(pages int, f float64) int {
	if f <= 0 || f >= 1 {
		return pages
	}
	return max(1, min(pages, int(math.Ceil(f*float64(pages)))))
}

// ResolveRate turns a rate specification into pages per second for a
// write cycle of hot pages and the interval ΔT: "min" is R_min = 1 page/ΔT,
// "max" is R_max = hot/ΔT (every page of the cycle once per ΔT), a number
// is pages per second.
func ResolveRate(spec string, hot int, interval time.Duration) (float64, error) {
	if interval <= 0 {
		return 0, fmt.Errorf("interval ΔT %v must be positive", interval)
	}
	switch s := strings.ToLower(strings.TrimSpace(spec)); s {
	case "min":
		return 1 / interval.Seconds(), nil
	case "max":
		return float64(hot) / interval.Seconds(), nil
	default:
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || r < 0 || math.IsInf(r, 0) || math.IsNaN(r) {
			return 0, fmt.Errorf("rate %q: want min, max or pages per second ≥ 0", spec)
		}
		return r, nil
	}
}

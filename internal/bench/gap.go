package bench

import (
	"sort"
	"time"
)

// Gap is the longest interval a client went without a reply around one
// migration.
type Gap struct {
	Length time.Duration
	Start  time.Time // the last reply before the gap
	// Open is set when no reply came after the gap before the observation
	// ended: the length is then only a lower bound.
	Open bool
}

// LongestGap returns the longest interval between consecutive replies
// (received at the sorted times replies) that overlaps the window
// [from, to]. An interval overlaps when it ends after from and starts
// before to, so a silence that begins inside the window and ends after it
// counts whole. When the last reply before to has no successor, the
// interval runs to end (the moment observation stopped) and the gap is
// Open. With no reply before the window the interval starts at from.
func LongestGap(replies []time.Time, from, to, end time.Time) Gap {
	// First reply after from; the one before it opens the first interval
	// that can overlap.
	i := sort.Search(len(replies), func(k int) bool { return replies[k].After(from) })
	prev := from
	if i > 0 {
		prev = replies[i-1]
	}
	var g Gap
	for ; i < len(replies) && prev.Before(to); i++ {
		if d := replies[i].Sub(prev); d > g.Length {
			g = Gap{Length: d, Start: prev}
		}
		prev = replies[i]
	}
	// The loop stopped with prev before to only when replies ran out: the
	// silence after the last reply lasted at least until end.
	if prev.Before(to) {
		if d := end.Sub(prev); d >= g.Length {
			g = Gap{Length: d, Start: prev, Open: true}
		}
	}
	return g
}

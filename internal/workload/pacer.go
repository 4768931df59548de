package workload

import (
	"fmt"
	"time"
)

// Pacer spreads writes evenly at a rate: Due(now) returns how many writes
// are due since the previous call so that, over any stretch without a gap,
// the writes done are ⌊rate·elapsed⌋.
//
// A call more than MaxGap after the previous one means the process did not
// run for a while (frozen by a checkpoint, stopped during a migration,
// starved of CPU). The pacer then takes the gap out of its clock instead of
// catching up: the writes of the gap are skipped, so the dirty rate after a
// restore is the configured one and not a burst, and progress towards the
// next write is kept (at R_min, one page per second of running time even
// when freezes come more often than once a second). Gaps counts them.
//
// Pacer takes the time as an argument and keeps no clock; it is not safe
// for concurrent use.
type Pacer struct {
	rate   float64       // writes per second
	maxGap time.Duration // longer silences restart the pacing
	epoch  time.Time     // start, moved forward by every gap
	last   time.Time     // previous call
	done   int64         // writes handed out since epoch
	gaps   int
}

// NewPacer returns a pacer for rate writes per second starting at now.
func NewPacer(rate float64, maxGap time.Duration, now time.Time) (*Pacer, error) {
	if !(rate >= 0) || maxGap <= 0 {
		return nil, fmt.Errorf("pacer: rate %v must be ≥ 0 and max gap %v positive", rate, maxGap)
	}
	return &Pacer{rate: rate, maxGap: maxGap, epoch: now, last: now}, nil
}

// Due returns the writes due at now. A clock that goes backwards yields 0.
func (p *Pacer) Due(now time.Time) int {
	if now.Before(p.last) {
		return 0
	}
	if gap := now.Sub(p.last); gap > p.maxGap {
		p.epoch = p.epoch.Add(gap)
		p.gaps++
	}
	p.last = now
	target := int64(p.rate * float64(now.Sub(p.epoch).Nanoseconds()) / 1e9)
	n := target - p.done
	p.done = target
	return int(max(0, n))
}

// Resume takes the time since the previous call out of the clock without
// counting a gap: the caller held the writes back on purpose (a check of
// the whole state) and resumes them at now.
func (p *Pacer) Resume(now time.Time) {
	if now.After(p.last) {
		p.epoch = p.epoch.Add(now.Sub(p.last))
		p.last = now
	}
}

// Gaps is the number of gaps the pacer took out of its clock.
func (p *Pacer) Gaps() int { return p.gaps }

// Rate is the pacer's rate in writes per second.
func (p *Pacer) Rate() float64 { return p.rate }

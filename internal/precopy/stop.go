package precopy

import (
	"errors"
	"fmt"
	"time"
)

// StopRule says when live rounds end and the container is frozen. Zero
// fields are off; at least one must be set. Rounds end at the first
// condition met, checked after each round.
type StopRule struct {
	// MaxRounds stops after this many rounds: the number of iterations
	// the performance model asks for (PAM's I plus the first full copy).
	MaxRounds int
	// DeltaBytes stops once a round found at most this much memory
	// changed: what is left for the frozen final round is then about as
	// small (typically link rate × the downtime budget).
	DeltaBytes int64
	// MinShrink stops when a round found more than MinShrink times the
	// changed memory of the round before (no progress: the dirty rate
	// keeps up with the rounds). 0.9 asks each round to shrink the delta
	// by at least 10%.
	MinShrink float64
	// Deadline stops when another round, expected to last as long as the
	// last one, would end after it.
	Deadline time.Time
}

// Validate reports what is wrong with r.
func (r StopRule) Validate() error {
	var errs []error
	if r.MaxRounds < 0 {
		errs = append(errs, fmt.Errorf("max rounds %d < 0", r.MaxRounds))
	}
	if r.DeltaBytes < 0 {
		errs = append(errs, fmt.Errorf("delta bytes %d < 0", r.DeltaBytes))
	}
	if r.MinShrink < 0 {
		errs = append(errs, fmt.Errorf("min shrink %g < 0", r.MinShrink))
	}
	if r.MaxRounds == 0 && r.DeltaBytes == 0 && r.MinShrink == 0 && r.Deadline.IsZero() {
		errs = append(errs, errors.New("no stop condition: set max rounds, delta bytes, min shrink or a deadline"))
	}
	return errors.Join(errs...)
}

// StopReason says why ShouldStop ended the rounds.
type StopReason string

// Stop reasons.
const (
	StopRounds     StopReason = "rounds"      // MaxRounds reached
	StopDelta      StopReason = "delta"       // delta small enough
	StopNoProgress StopReason = "no-progress" // delta stopped shrinking
	StopDeadline   StopReason = "deadline"    // no time for another round
)

// ShouldStop decides, after the rounds in history (oldest first), whether
// to stop and freeze, and why. now is the current time (for Deadline).
// With no rounds yet it says no: the first round always runs.
func ShouldStop(history []RoundStats, rule StopRule, now time.Time) (StopReason, bool) {
	n := len(history)
	if n == 0 {
		return "", false
	}
	last := history[n-1]
	switch {
	case rule.MaxRounds > 0 && n >= rule.MaxRounds:
		return StopRounds, true
	case rule.DeltaBytes > 0 && last.ChangedBytes() <= rule.DeltaBytes:
		return StopDelta, true
	case rule.MinShrink > 0 && n >= 2 && float64(last.Changed) > rule.MinShrink*float64(history[n-2].Changed):
		return StopNoProgress, true
	case !rule.Deadline.IsZero() && now.Add(last.Duration).After(rule.Deadline):
		return StopDeadline, true
	}
	return "", false
}

package linkemu

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Params describe one direction of one link: what every packet passing
// through the direction's queue suffers.
type Params struct {
	// Delay is the one-way delay added to every packet.
	Delay time.Duration
	// Jitter spreads each packet's delay uniformly over
	// [Delay-Jitter, Delay+Jitter] (clamped at 0). Jitter never reorders a
	// queue: a packet is never released before the one ahead of it, so under
	// load the mean delay is above Delay.
	Jitter time.Duration
	// Loss is the probability in [0, 1] that a packet is dropped.
	Loss float64
}

// ErrInvalidParams is returned (wrapped) for out-of-range parameters.
var ErrInvalidParams = errors.New("invalid link parameters")

// maxDelay bounds Delay and Jitter: a link slower than this is a mistake,
// and the bound keeps release-time arithmetic far from overflow.
const maxDelay = time.Minute

// Validate reports whether p is usable.
func (p Params) Validate() error {
	switch {
	case p.Delay < 0 || p.Delay > maxDelay:
		return fmt.Errorf("%w: delay %v outside [0, %v]", ErrInvalidParams, p.Delay, maxDelay)
	case p.Jitter < 0 || p.Jitter > maxDelay:
		return fmt.Errorf("%w: jitter %v outside [0, %v]", ErrInvalidParams, p.Jitter, maxDelay)
	case !(p.Loss >= 0 && p.Loss <= 1): // also rejects NaN
		return fmt.Errorf("%w: loss %v outside [0, 1]", ErrInvalidParams, p.Loss)
	}
	return nil
}

// String formats p for logs: "delay=10ms jitter=0s loss=0".
func (p Params) String() string {
	return fmt.Sprintf("delay=%v jitter=%v loss=%g", p.Delay, p.Jitter, p.Loss)
}

// pipe decides the fate of the packets of one queue. It is a pure state
// machine: given the same random source and the same arrival times it makes
// the same decisions. It is not safe for concurrent use.
type pipe struct {
	params Params
	rng    *rand.Rand
	// last is the release time of the latest packet admitted; no later
	// packet is released before it (FIFO).
	last time.Time
}

func newPipe(p Params, rng *rand.Rand) *pipe { return &pipe{params: p, rng: rng} }

// admit decides for a packet arriving at now: drop it, or release it at
// release (which may equal now: release at once). Releases never decrease.
func (p *pipe) admit(now time.Time) (release time.Time, drop bool) {
	if p.params.Loss > 0 && p.rng.Float64() < p.params.Loss {
		return time.Time{}, true
	}
	d := p.params.Delay
	if j := p.params.Jitter; j > 0 {
		// Uniform over [-j, +j].
		d += time.Duration(p.rng.Int64N(2*int64(j)+1)) - j
		d = max(d, 0)
	}
	release = now.Add(d)
	if release.Before(p.last) {
		release = p.last
	}
	p.last = release
	return release, false
}

// set changes the parameters for packets admitted from now on; packets
// already admitted keep their release times.
func (p *pipe) set(params Params) { p.params = params }

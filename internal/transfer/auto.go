package transfer

import (
	"fmt"
	"time"
)

const (
	// autoMargin is how much faster compressed sending must be predicted
	// to be before CompressAuto pays for it: it covers the receiver's
	// decompression and the noise of a one-chunk measurement.
	autoMargin = 1.15
	// autoReprobe is how many chunks CompressAuto sends uncompressed
	// between probes while compression is off.
	autoReprobe = 16
	// autoMinProbe is the smallest chunk worth probing: tiny chunks say
	// little about ratio or speed.
	autoMinProbe = 64 << 10
	// autoWeight is the weight of the newest observation in the running
	// ratio and speed estimates.
	autoWeight = 0.3
)

// worthCompressing decides CompressAuto. Sending is a pipeline (compress
// one chunk while the previous one is on the wire), so with compression the
// stream moves min(speed, ratio×link) raw bytes per second, and without it
// moves link bytes per second. Compression is kept when the first beats the
// second by autoMargin. speed is this CPU's compression rate in raw bytes
// per second, ratio is raw/compressed size, link is bytes per second.
func worthCompressing(speed, ratio, link float64) bool {
	if speed <= 0 || ratio <= 0 || link <= 0 {
		return false
	}
	return min(speed, ratio*link) > autoMargin*link
}

// autoState holds CompressAuto's running estimates. It belongs to one
// producer goroutine.
type autoState struct {
	link         float64 // bytes per second
	on           bool
	observed     bool
	skip         int // chunks to send before the next probe while off
	ratio, speed float64
	// floor is the least compression speed to assume (Conn.WarmCompression
	// measured it outside the busy moment); 0 when unknown.
	floor float64
}

// wantProbe says whether to compress a chunk of n bytes: every chunk while
// compression is on (each one refreshes the estimates), and one probe every
// autoReprobe chunks while it is off.
func (a *autoState) wantProbe(n int) bool {
	if a.on {
		return true
	}
	if a.skip > 0 {
		a.skip--
		return false
	}
	return n >= autoMinProbe
}

// observe records one compression of raw bytes to comp bytes in elapsed
// time and decides whether to keep compressing.
func (a *autoState) observe(raw, comp int, elapsed time.Duration) {
	if comp <= 0 {
		comp = 1
	}
	ratio := float64(raw) / float64(comp)
	speed := float64(raw) / max(elapsed.Seconds(), 1e-9)
	if a.observed {
		ratio = autoWeight*ratio + (1-autoWeight)*a.ratio
		speed = autoWeight*speed + (1-autoWeight)*a.speed
	}
	a.ratio, a.speed, a.observed = ratio, max(speed, a.floor), true
	a.on = worthCompressing(a.speed, a.ratio, a.link)
	if !a.on {
		a.skip = autoReprobe
	}
}

// String explains the latest decision, or is empty before any probe.
func (a *autoState) String() string {
	if !a.observed {
		return ""
	}
	verdict := "off"
	if a.on {
		verdict = "on"
	}
	return fmt.Sprintf("zstd %s: ratio %.2f at %.0f MB/s vs link %.0f MB/s", verdict, a.ratio, a.speed/1e6, a.link/1e6)
}

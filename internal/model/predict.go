package model

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Strategy names a way to migrate. The first four are what edgehop runs;
// the others are the published models, for comparison.
type Strategy string

const (
	// StopAndCopy freezes, dumps with CRIU to tmpfs, streams the images,
	// restores and switches the network.
	StopAndCopy Strategy = "stop-and-copy"
	// PostCopy freezes, dumps without memory pages, restores with lazy
	// pages and pulls the pages afterwards.
	PostCopy Strategy = "post-copy"
	// PreCopy runs live rounds that read memory without freezing and send
	// the pages whose hash changed, then freezes, dumps and sends the delta.
	PreCopy Strategy = "pre-copy"
	// Hybrid runs pre-copy rounds and then post-copy for the rest.
	Hybrid Strategy = "hybrid"

	// PAMTraditional is PAM's traditional iterative pre-copy (eqs. 29–30).
	PAMTraditional Strategy = "pam-traditional"
	// PAMCOAT is PAM's COAT procedure (eqs. 31–32).
	PAMCOAT Strategy = "pam-coat"
	// SotAModel is the network-only baseline PAM is compared with.
	SotAModel Strategy = "sota"
	// ARNABModel is ARNAB's pre-copy model (eqs. 1–7).
	ARNABModel Strategy = "arnab"
)

// EdgehopStrategies lists the strategies edgehop runs, in the planner's
// order of preference when costs tie.
var EdgehopStrategies = []Strategy{StopAndCopy, PreCopy, Hybrid, PostCopy}

// AllStrategies lists every strategy Predict knows.
var AllStrategies = []Strategy{StopAndCopy, PreCopy, Hybrid, PostCopy, PAMTraditional, PAMCOAT, SotAModel, ARNABModel}

// ErrUnknownStrategy reports a strategy name Predict does not know.
var ErrUnknownStrategy = errors.New("unknown strategy")

// ErrInvalidInputs reports inputs the model cannot evaluate.
var ErrInvalidInputs = errors.New("invalid model inputs")

// ParseStrategy returns the strategy named s.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range AllStrategies {
		if string(st) == s {
			return st, nil
		}
	}
	names := make([]string, len(AllStrategies))
	for i, st := range AllStrategies {
		names[i] = string(st)
	}
	return "", fmt.Errorf("%w %q (want one of %s)", ErrUnknownStrategy, s, strings.Join(names, ", "))
}

// lazy reports whether the strategy restores with lazy pages.
func (s Strategy) lazy() bool { return s == PostCopy || s == Hybrid }

// rounds reports whether the strategy runs live pre-copy rounds.
func (s Strategy) rounds() bool { return s == PreCopy || s == Hybrid }

// Inputs describe one migration to predict.
type Inputs struct {
	StateBytes   float64 `json:"state_bytes"`   // M
	DirtyRate    float64 `json:"dirty_rate"`    // R, pages/s
	BandwidthBps float64 `json:"bandwidth_bps"` // L, bit/s (+Inf allowed: processing only)
	RTTMs        float64 `json:"rtt_ms"`
	// Iterations is the number of live rounds for pre-copy and hybrid
	// (at least 1), the dump iterations I for the PAM and SotA models and n
	// for ARNAB; stop-and-copy and post-copy ignore it.
	Iterations int  `json:"iterations"`
	Compressed bool `json:"compressed"`
}

// Validate checks the inputs.
func (in Inputs) Validate() error {
	switch {
	case !(in.StateBytes >= 0) || math.IsInf(in.StateBytes, 0):
		return fmt.Errorf("%w: state size %v", ErrInvalidInputs, in.StateBytes)
	case !(in.DirtyRate >= 0) || math.IsInf(in.DirtyRate, 0):
		return fmt.Errorf("%w: dirty rate %v", ErrInvalidInputs, in.DirtyRate)
	case !(in.BandwidthBps > 0):
		return fmt.Errorf("%w: bandwidth %v", ErrInvalidInputs, in.BandwidthBps)
	case !(in.RTTMs >= 0) || math.IsInf(in.RTTMs, 0):
		return fmt.Errorf("%w: rtt %v", ErrInvalidInputs, in.RTTMs)
	case in.Iterations < 0:
		return fmt.Errorf("%w: iterations %d", ErrInvalidInputs, in.Iterations)
	}
	return nil
}

// Phase is one timed step of a predicted migration. Names match the keys of
// Sample.PhasesMs.
type Phase struct {
	Name     string  `json:"name"`
	Ms       float64 `json:"ms"`
	Downtime bool    `json:"downtime"` // the service is not running
}

// Round is one pre-copy iteration.
type Round struct {
	Index      int     `json:"index"`
	DirtyPages float64 `json:"dirty_pages"` // pages sent (iteration 0: the whole state)
	WireBytes  float64 `json:"wire_bytes"`
	Ms         float64 `json:"ms"`
}

// Prediction is what the model expects of one migration.
type Prediction struct {
	Strategy   Strategy `json:"strategy"`
	Iterations int      `json:"iterations"`
	Compressed bool     `json:"compressed"`
	// NormalizedRate is PAM's r for the PAM models.
	NormalizedRate *float64 `json:"normalized_rate,omitempty"`
	DowntimeMs     float64  `json:"downtime_ms"`
	TotalMs        float64  `json:"total_ms"`
	// SplitMs is how long after the service resumes part of its memory is
	// still only at the source (post-copy and hybrid): a failure of the
	// source or the link in this window loses the service.
	SplitMs     float64 `json:"split_ms"`
	BytesOnWire float64 `json:"bytes_on_wire"`
	Phases      []Phase `json:"phases"`
	Rounds      []Round `json:"rounds,omitempty"`
}

// PhasesMs returns the predicted phase durations keyed like Sample.PhasesMs.
func (pr Prediction) PhasesMs() map[string]float64 {
	m := make(map[string]float64, len(pr.Phases))
	for _, ph := range pr.Phases {
		m[ph.Name] += ph.Ms
	}
	return m
}

func (pr *Prediction) add(name string, ms float64, down bool) {
	pr.Phases = append(pr.Phases, Phase{Name: name, Ms: ms, Downtime: down})
	pr.TotalMs += ms
	if down {
		pr.DowntimeMs += ms
	}
}

// Predict returns the model's prediction of migrating with strategy s.
func (p Params) Predict(s Strategy, in Inputs) (Prediction, error) {
	if err := p.Validate(); err != nil {
		return Prediction{}, err
	}
	if err := in.Validate(); err != nil {
		return Prediction{}, err
	}
	switch s {
	case StopAndCopy, PostCopy, PreCopy, Hybrid:
		if s.rounds() && in.Iterations < 1 {
			return Prediction{}, fmt.Errorf("%w: %s needs at least one live round", ErrInvalidInputs, s)
		}
		return p.predictEdgehop(s, in), nil
	case PAMTraditional, PAMCOAT:
		return p.predictPAM(s, in), nil
	case SotAModel:
		res := SotA{StateBytes: in.StateBytes, DirtyRate: in.DirtyRate, PageBytes: p.PageBytes,
			BandwidthBps: in.BandwidthBps, Iterations: in.Iterations}.Predict()
		pr := Prediction{Strategy: s, Iterations: in.Iterations}
		pr.add("precopy", res.TotalMs-res.DowntimeMs, false)
		pr.add("transfer", res.DowntimeMs, true)
		for i, v := range res.VolumesBytes {
			pr.BytesOnWire += v
			if i <= in.Iterations {
				pr.Rounds = append(pr.Rounds, Round{Index: i, DirtyPages: v / p.PageBytes, WireBytes: v, Ms: NetMs(v, in.BandwidthBps)})
			}
		}
		return pr, nil
	case ARNABModel:
		res := ARNABFromParams(p, in).Predict()
		pr := Prediction{Strategy: s, Iterations: in.Iterations}
		pr.add("prepare", p.PrepareMs, false)
		pr.add("precopy", res.TotalMs-res.DowntimeMs-p.PrepareMs, false)
		last := res.IterationMs[in.Iterations]
		pr.add("dump", last-res.CopyMs[in.Iterations], true)
		pr.add("transfer", res.CopyMs[in.Iterations], true)
		pr.add("restore", res.RestoreMs, true)
		for i, b := range res.CopiedBytes {
			pr.BytesOnWire += b
			if i < in.Iterations {
				pr.Rounds = append(pr.Rounds, Round{Index: i, DirtyPages: b / p.PageBytes, WireBytes: b, Ms: res.IterationMs[i]})
			}
		}
		return pr, nil
	}
	return Prediction{}, fmt.Errorf("%w %q", ErrUnknownStrategy, s)
}

// predictPAM evaluates eqs. 27–32 at the normalized rate of the inputs.
func (p Params) predictPAM(s Strategy, in Inputs) Prediction {
	if in.Compressed {
		p.Rho = p.CompressRatio
	}
	m, l, iter := in.StateBytes, in.BandwidthBps, in.Iterations
	r := p.NormalizedRate(m, in.DirtyRate)
	pr := Prediction{Strategy: s, Iterations: iter, Compressed: in.Compressed, NormalizedRate: &r}
	pr.add("precopy", p.Iteration0Ms(m, l)+float64(iter)*p.IterationMs(m, r, l), false) // eqs. 27–28
	pr.add("freeze", p.ckpt()*p.BetaMs, true)                                           // eq. 14, 15
	pr.add("dump", p.ckpt()*p.DumpFrozenMs(m, r), true)                                 // eq. 14, 17
	pr.add("transfer", NetMs(p.DumpVolume(m, r), l), true)                              // T^net_{I+1}
	pr.add("restore", p.RestoreMs(m), true)                                             // eq. 26
	if s == PAMCOAT {
		pr.add("network", p.COATAddMs(), true) // eq. 31
	}
	pr.BytesOnWire = p.PredumpVolume(m) + float64(iter+1)*p.DumpVolume(m, r)
	pr.Rounds = append(pr.Rounds, Round{Index: 0, DirtyPages: p.PredumpPages(m), WireBytes: p.PredumpVolume(m), Ms: p.Iteration0Ms(m, l)})
	for i := 1; i <= iter; i++ {
		pr.Rounds = append(pr.Rounds, Round{Index: i, DirtyPages: p.DumpPages(m, r), WireBytes: p.DumpVolume(m, r), Ms: p.IterationMs(m, r, l)})
	}
	return pr
}

// edgehopRun holds what every phase of an edgehop prediction needs.
type edgehopRun struct {
	p   Params
	in  Inputs
	rho float64
}

// xfer returns the time and the wire bytes of sending raw bytes once.
func (e edgehopRun) xfer(raw float64) (ms, wire float64) {
	wire = e.rho * raw
	ms = e.p.NetFixedMs + e.in.RTTMs + e.p.NetFactor*NetMs(wire, e.in.BandwidthBps)
	if e.in.Compressed {
		ms += e.p.CompressMsPerByte * raw
	}
	return ms, wire
}

// predictEdgehop models edgehop's strategies from the PAM relations at
// R_max for anything CRIU dumps (the kernel has no soft-dirty tracking, so
// every dump writes the whole state) and eq. 6 for live rounds: the pages
// dirtied during a round are Nᵢ = R·T_{i−1} (no frozen time to subtract,
// the rounds never freeze), at most the state's pages νᵖ·M.
func (p Params) predictEdgehop(s Strategy, in Inputs) Prediction {
	e := edgehopRun{p: p, in: in, rho: p.Rho}
	if in.Compressed {
		e.rho = p.CompressRatio
	}
	m, sigma := in.StateBytes, p.PageBytes
	statePages := p.NuPPerByte * m
	pr := Prediction{Strategy: s, Compressed: in.Compressed}
	pr.add("prepare", p.PrepareMs, false)

	// Live rounds (pre-copy, hybrid).
	var lastRoundMs float64
	if s.rounds() {
		pr.Iterations = in.Iterations
		read := p.LiveReadMs + p.LiveReadMsPerByte*m
		var precopy float64
		for i := 0; i < in.Iterations; i++ {
			pages := p.PredumpPages(m) // eq. 22: the first round sends everything
			raw := p.Tau1 * pages * sigma
			if i > 0 {
				pages = math.Min(in.DirtyRate*lastRoundMs/1000, statePages) // eq. 6
				raw = p.Tau1 * (p.MuD + pages) * sigma
			}
			ms, wire := e.xfer(raw)
			lastRoundMs = read + ms
			precopy += lastRoundMs
			pr.BytesOnWire += wire
			pr.Rounds = append(pr.Rounds, Round{Index: i, DirtyPages: pages, WireBytes: wire, Ms: lastRoundMs})
		}
		pr.add("precopy", precopy, false)
	}
	dirty := math.Min(in.DirtyRate*lastRoundMs/1000, statePages) // eq. 6 for the final delta

	pr.add("freeze", p.ckpt()*p.BetaMs, true) // eqs. 14–15
	if s.lazy() {
		pr.add("dump", p.ckpt()*p.PhiDMs, true) // eq. 17 with no pages dumped
		ms, wire := e.xfer(p.Tau1 * p.MuP * sigma)
		pr.add("transfer", ms, true) // eq. 24 at M = 0
		pr.BytesOnWire += wire
		pr.add("restore", p.rest()*p.PsiMs, true) // eq. 26 at M = 0
	} else {
		pr.add("dump", p.ckpt()*p.DumpFrozenMs(m, 1), true) // eq. 17 at R_max
		raw := p.Tau1 * p.PredumpPages(m) * sigma           // eq. 24
		var diff float64
		if s == PreCopy {
			raw = p.Tau1 * (p.MuD + dirty) * sigma
			diff = p.DiffMsPerByte * m
		}
		ms, wire := e.xfer(raw)
		pr.add("transfer", diff+ms, true)
		pr.BytesOnWire += wire
		pr.add("restore", p.RestoreMs(m), true) // eq. 26
	}
	pr.add("network", p.SwitchMs, true)

	if s.lazy() {
		remotePages, localPages := statePages, 0.0
		if s == Hybrid {
			remotePages, localPages = dirty, statePages-dirty
		}
		raw := p.Tau1 * remotePages * sigma
		// The page server's stream is never compressed, whatever the
		// image streams were.
		plain := edgehopRun{p: p, in: in, rho: p.Rho}
		plain.in.Compressed = false
		ms, wire := plain.xfer(raw)
		pull := p.LazyFixedMs + ms + p.LazyMsPerByte*remotePages*sigma + p.LocalInstallMsPerByte*localPages*sigma
		lazy := p.lazyWithFaults(pull, in.DirtyRate, remotePages)
		pr.add("lazy", lazy, false)
		pr.SplitMs = lazy
		pr.BytesOnWire += wire
	}
	pr.add("cleanup", p.CleanupMs, false)
	return pr
}

// lazyWithFaults adds to a lazy pull of pull ms the faults of the pages the
// service touches before the pull brings them: as in eq. 6, it touches R
// pages per second during the whole lazy phase T, at most the pages still
// remote, so T = pull + c·min(R·T, pages) with c = LazyFaultMsPerPage.
func (p Params) lazyWithFaults(pull, rate, pages float64) float64 {
	c := p.LazyFaultMsPerPage
	if k := c * rate / 1000; k < 1 { // T = pull/(1 − c·R) while R·T < pages
		if t := pull / (1 - k); rate*t/1000 < pages {
			return t
		}
	}
	return pull + c*pages
}

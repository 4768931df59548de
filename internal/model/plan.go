package model

import (
	"fmt"
	"math"
	"strings"
)

// DefaultMaxRounds bounds the live rounds the planner tries for pre-copy
// and hybrid when Request.MaxRounds is zero.
const DefaultMaxRounds = 10

// Request asks the planner how to migrate.
type Request struct {
	// Inputs describe the migration; the planner chooses Iterations and
	// Compressed itself.
	Inputs        Inputs  `json:"inputs"`
	MaxDowntimeMs float64 `json:"max_downtime_ms,omitempty"` // 0: no target
	MaxTotalMs    float64 `json:"max_total_ms,omitempty"`    // 0: no target
	MaxRounds     int     `json:"max_rounds,omitempty"`      // 0: DefaultMaxRounds
	// Strategies to consider; nil means EdgehopStrategies.
	Strategies []Strategy `json:"strategies,omitempty"`
	// ByStrategy overrides the parameter set per strategy (fitted sets).
	ByStrategy map[Strategy]Params `json:"-"`
}

// Candidate is the best way found to migrate with one strategy.
type Candidate struct {
	Strategy   Strategy   `json:"strategy"`
	Iterations int        `json:"iterations"`
	Compressed bool       `json:"compressed"`
	Params     string     `json:"params"`
	Prediction Prediction `json:"prediction"`
	Feasible   bool       `json:"feasible"`
	// Unmet lists the targets this candidate misses.
	Unmet []string `json:"unmet,omitempty"`
	// FloorDowntimeMs is this strategy's downtime at infinite bandwidth:
	// processing alone.
	FloorDowntimeMs float64 `json:"floor_downtime_ms"`
	// NeedBandwidthBps is, for a candidate that misses a target, the least
	// bandwidth at which the strategy meets every target; 0 when none does.
	NeedBandwidthBps float64 `json:"need_bandwidth_bps,omitempty"`
}

// PlanResult is the planner's answer.
type PlanResult struct {
	Feasible bool `json:"feasible"`
	// Choice is the recommendation: the cheapest candidate that meets every
	// target or, when none does, the one closest to them.
	Choice Candidate `json:"choice"`
	// Unmet lists the targets the choice misses.
	Unmet []string `json:"unmet,omitempty"`
	// RequiredBandwidthBps is, when no candidate is feasible, the least
	// bandwidth at which some strategy meets every target; 0 when no
	// bandwidth is enough.
	RequiredBandwidthBps float64 `json:"required_bandwidth_bps,omitempty"`
	// RequiredBandwidthStrategy is the strategy that needs the least.
	RequiredBandwidthStrategy Strategy `json:"required_bandwidth_strategy,omitempty"`
	Reason                    string   `json:"reason"`
	// Candidates holds the best candidate of every strategy considered.
	Candidates []Candidate `json:"candidates"`
}

// Target names used in Unmet.
const (
	TargetDowntime = "max_downtime_ms"
	TargetTotal    = "max_total_ms"
)

// Plan recommends how to migrate: among the strategies, live-round counts
// and compression settings, the cheapest that meets every target. Cost is
// ordered as follows: first whether the service depends on the source after
// it resumes (post-copy and hybrid do, a failure then loses it), then the
// total migration time (PAM's "migration cost for the network operator"),
// then the bytes on the wire. When nothing meets the targets it says which
// are missed and what bandwidth would be needed.
func Plan(p Params, req Request) (PlanResult, error) {
	if err := req.Inputs.Validate(); err != nil {
		return PlanResult{}, err
	}
	if req.MaxDowntimeMs < 0 || req.MaxTotalMs < 0 {
		return PlanResult{}, fmt.Errorf("%w: negative target", ErrInvalidInputs)
	}
	strategies := req.Strategies
	if len(strategies) == 0 {
		strategies = EdgehopStrategies
	}
	var res PlanResult
	for _, s := range strategies {
		if s != StopAndCopy && s != PreCopy && s != Hybrid && s != PostCopy {
			return PlanResult{}, fmt.Errorf("%w: the planner chooses among edgehop strategies, not %q", ErrUnknownStrategy, s)
		}
		sp := p
		if o, ok := req.ByStrategy[s]; ok {
			sp = o
		}
		c, err := bestCandidate(sp, s, req, req.Inputs.BandwidthBps)
		if err != nil {
			return PlanResult{}, err
		}
		inf := req.Inputs
		inf.BandwidthBps = math.Inf(1)
		inf.Iterations = c.Iterations
		inf.Compressed = c.Compressed
		floor, err := sp.Predict(s, inf)
		if err != nil {
			return PlanResult{}, err
		}
		c.FloorDowntimeMs = floor.DowntimeMs
		if !c.Feasible {
			c.NeedBandwidthBps, err = needBandwidth(sp, s, req)
			if err != nil {
				return PlanResult{}, err
			}
		}
		res.Candidates = append(res.Candidates, c)
	}
	best := 0
	for i := 1; i < len(res.Candidates); i++ {
		if better(res.Candidates[i], res.Candidates[best], req) {
			best = i
		}
	}
	res.Choice = res.Candidates[best]
	res.Feasible = res.Choice.Feasible
	res.Unmet = res.Choice.Unmet
	if !res.Feasible {
		if err := requiredBandwidth(p, req, &res); err != nil {
			return PlanResult{}, err
		}
	}
	res.Reason = reason(res, req)
	return res, nil
}

// bestCandidate searches the rounds and compression settings of one
// strategy at bandwidth l.
func bestCandidate(p Params, s Strategy, req Request, l float64) (Candidate, error) {
	rounds := []int{0}
	if s.rounds() {
		n := req.MaxRounds
		if n <= 0 {
			n = DefaultMaxRounds
		}
		rounds = rounds[:0]
		for k := 1; k <= n; k++ {
			rounds = append(rounds, k)
		}
	}
	var best Candidate
	found := false
	for _, k := range rounds {
		for _, comp := range []bool{false, true} {
			in := req.Inputs
			in.BandwidthBps, in.Iterations, in.Compressed = l, k, comp
			pr, err := p.Predict(s, in)
			if err != nil {
				return Candidate{}, fmt.Errorf("plan %s: %w", s, err)
			}
			c := Candidate{Strategy: s, Iterations: k, Compressed: comp, Params: p.Name, Prediction: pr}
			c.Unmet = unmet(pr, req)
			c.Feasible = len(c.Unmet) == 0
			if !found || better(c, best, req) {
				best, found = c, true
			}
		}
	}
	return best, nil
}

func unmet(pr Prediction, req Request) []string {
	var u []string
	if req.MaxDowntimeMs > 0 && pr.DowntimeMs > req.MaxDowntimeMs {
		u = append(u, TargetDowntime)
	}
	if req.MaxTotalMs > 0 && pr.TotalMs > req.MaxTotalMs {
		u = append(u, TargetTotal)
	}
	return u
}

// excess is how far a prediction is from its targets: the largest ratio of
// predicted to target value.
func excess(pr Prediction, req Request) float64 {
	x := 0.0
	if req.MaxDowntimeMs > 0 {
		x = math.Max(x, pr.DowntimeMs/req.MaxDowntimeMs)
	}
	if req.MaxTotalMs > 0 {
		x = math.Max(x, pr.TotalMs/req.MaxTotalMs)
	}
	return x
}

// better reports whether a is preferable to b (see Plan for the order).
func better(a, b Candidate, req Request) bool {
	if a.Feasible != b.Feasible {
		return a.Feasible
	}
	if !a.Feasible {
		ea, eb := excess(a.Prediction, req), excess(b.Prediction, req)
		if ea != eb {
			return ea < eb
		}
	}
	sa, sb := a.Prediction.SplitMs > 0, b.Prediction.SplitMs > 0
	if sa != sb {
		return !sa
	}
	if a.Prediction.TotalMs != b.Prediction.TotalMs {
		return a.Prediction.TotalMs < b.Prediction.TotalMs
	}
	return a.Prediction.BytesOnWire < b.Prediction.BytesOnWire
}

// needBandwidth returns the least bandwidth at which strategy s meets every
// target, or 0 when not even infinite bandwidth does. Predictions never get
// worse with more bandwidth, so feasibility is monotone and bisection (on a
// logarithmic scale) finds the threshold.
func needBandwidth(p Params, s Strategy, req Request) (float64, error) {
	feasible := func(l float64) (bool, error) {
		c, err := bestCandidate(p, s, req, l)
		return c.Feasible, err
	}
	ok, err := feasible(math.Inf(1))
	if err != nil || !ok {
		return 0, err
	}
	lo := req.Inputs.BandwidthBps
	hi := lo
	for {
		hi *= 2
		ok, err := feasible(hi)
		if err != nil {
			return 0, err
		}
		if ok {
			break
		}
		if hi > 1e18 { // feasible only in the limit: report no finite bandwidth
			return 0, nil
		}
		lo = hi
	}
	for i := 0; i < 60 && hi/lo > 1+1e-9; i++ {
		mid := math.Sqrt(lo * hi)
		ok, err := feasible(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// requiredBandwidth sets the least bandwidth any strategy needs. Strategies
// needing the same bandwidth (post-copy and hybrid share their downtime)
// are compared at that bandwidth with the plan's cost order.
func requiredBandwidth(p Params, req Request, res *PlanResult) error {
	least := 0.0
	for _, c := range res.Candidates {
		if c.NeedBandwidthBps > 0 && (least == 0 || c.NeedBandwidthBps < least) {
			least = c.NeedBandwidthBps
		}
	}
	if least == 0 {
		return nil
	}
	var best Candidate
	found := false
	for _, c := range res.Candidates {
		if c.NeedBandwidthBps == 0 || c.NeedBandwidthBps > least*(1+1e-6) {
			continue
		}
		sp := p
		if o, ok := req.ByStrategy[c.Strategy]; ok {
			sp = o
		}
		at, err := bestCandidate(sp, c.Strategy, req, c.NeedBandwidthBps)
		if err != nil {
			return err
		}
		at.NeedBandwidthBps = c.NeedBandwidthBps
		if !found || better(at, best, req) {
			best, found = at, true
		}
	}
	res.RequiredBandwidthBps, res.RequiredBandwidthStrategy = best.NeedBandwidthBps, best.Strategy
	return nil
}

func reason(res PlanResult, req Request) string {
	c := res.Choice
	var b strings.Builder
	if res.Feasible {
		fmt.Fprintf(&b, "%s meets every target: downtime %.0f ms, total %.0f ms", c.Strategy, c.Prediction.DowntimeMs, c.Prediction.TotalMs)
		var others []string
		for _, o := range res.Candidates {
			if o.Strategy == c.Strategy {
				continue
			}
			if o.Feasible {
				others = append(others, fmt.Sprintf("%s also does (total %.0f ms, split %.0f ms)", o.Strategy, o.Prediction.TotalMs, o.Prediction.SplitMs))
			} else {
				others = append(others, fmt.Sprintf("%s misses %s", o.Strategy, strings.Join(o.Unmet, ", ")))
			}
		}
		if len(others) > 0 {
			b.WriteString("; " + strings.Join(others, "; "))
		}
		return b.String()
	}
	fmt.Fprintf(&b, "no strategy meets %s at %s", strings.Join(res.Unmet, " and "), FormatBandwidth(req.Inputs.BandwidthBps))
	fmt.Fprintf(&b, "; closest: %s (downtime %.0f ms, total %.0f ms)", c.Strategy, c.Prediction.DowntimeMs, c.Prediction.TotalMs)
	if res.RequiredBandwidthBps > 0 {
		fmt.Fprintf(&b, "; %s would meet them at %s", res.RequiredBandwidthStrategy, FormatBandwidth(res.RequiredBandwidthBps))
	} else {
		floor := math.Inf(1)
		for _, o := range res.Candidates {
			floor = math.Min(floor, o.FloorDowntimeMs)
		}
		fmt.Fprintf(&b, "; no bandwidth is enough: processing alone takes at least %.0f ms of downtime", floor)
	}
	return b.String()
}

// FormatBandwidth renders bit/s for people, e.g. "1.25 Gbit/s".
func FormatBandwidth(bps float64) string {
	switch {
	case math.IsInf(bps, 1):
		return "unlimited"
	case bps >= 1e9:
		return fmt.Sprintf("%.3g Gbit/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.3g Mbit/s", bps/1e6)
	case bps >= 1e3:
		return fmt.Sprintf("%.3g kbit/s", bps/1e3)
	}
	return fmt.Sprintf("%.3g bit/s", bps)
}

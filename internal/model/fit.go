package model

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// Sample is one measured migration.
type Sample struct {
	Strategy     string             `json:"strategy"`      // stop-and-copy | post-copy | pre-copy | hybrid
	Pair         string             `json:"pair"`          // "node0->node1"
	StateBytes   int64              `json:"state_bytes"`   // M
	DirtyRate    float64            `json:"dirty_rate"`    // R, pages/s
	BandwidthBps float64            `json:"bandwidth_bps"` // L, bits/s
	RTTMs        float64            `json:"rtt_ms"`
	Iterations   int                `json:"iterations"`
	Compressed   bool               `json:"compressed"`
	PhasesMs     map[string]float64 `json:"phases_ms"` // prepare, precopy, freeze, dump, transfer, restore, network, cleanup
	DowntimeMs   float64            `json:"downtime_ms"`
	TotalMs      float64            `json:"total_ms"`
	BytesOnWire  int64              `json:"bytes_on_wire"`
	CRIU         map[string]float64 `json:"criu"` // freezing_time_us, frozen_time_us, memdump_time_us, memwrite_time_us, pages_scanned, pages_written, pages_skipped_parent, restore_time_us, ...
}

// Phase keys of Sample.PhasesMs (and Prediction.Phases). PhaseLazy is the
// time from the service's resume to the last lazily pulled page.
const (
	PhasePrepare  = "prepare"
	PhasePrecopy  = "precopy"
	PhaseFreeze   = "freeze"
	PhaseDump     = "dump"
	PhaseTransfer = "transfer"
	PhaseRestore  = "restore"
	PhaseNetwork  = "network"
	PhaseLazy     = "lazy"
	PhaseCleanup  = "cleanup"
)

// Keys of Sample.CRIU that Fit reads. The first ones are CRIU's stats-dump
// and stats-restore fields (times in µs); the last three are edgehop's own
// counters, recorded in the same map.
const (
	KeyFreezingUs   = "freezing_time_us"
	KeyFrozenUs     = "frozen_time_us"
	KeyMemdumpUs    = "memdump_time_us"
	KeyMemwriteUs   = "memwrite_time_us"
	KeyPagesWritten = "pages_written"
	KeyPagesLazy    = "pages_lazy"
	KeyRestoreUs    = "restore_time_us"
	KeyPrecopyBytes = "precopy_bytes" // wire bytes of the live rounds
	KeyLazyBytes    = "lazy_bytes"    // wire bytes pulled after a lazy restore
	KeyRawBytes     = "raw_bytes"     // bytes before compression
)

// PooledStrategy is the strategy name of the set fitted on every sample of
// a pair.
const PooledStrategy = "*"

// Relation is one fitted linear relation with its goodness of fit. Lines
// and ratios are fitted by least squares on relative errors (weights 1/y²,
// as timings scatter in proportion to their size), made robust with Huber's
// weights (robustWLSQ) so a migration slowed by a neighbour's load does not
// drag the fit; a constant is the Huber mean. R² and RMSE are the ordinary,
// unweighted ones.
type Relation struct {
	Name        string    `json:"name"`
	Observation string    `json:"observation"` // paper equation and observation it estimates
	Y           string    `json:"y"`
	X           []string  `json:"x,omitempty"`
	Kind        string    `json:"kind"` // constant | linear | ratio | intercept
	Intercept   float64   `json:"intercept"`
	Slopes      []float64 `json:"slopes,omitempty"`
	R2          *float64  `json:"r2,omitempty"` // nil: constant or y without variance
	RMSE        float64   `json:"rmse"`
	N           int       `json:"n"`
	Note        string    `json:"note,omitempty"`
}

// Validation compares a fitted set's predictions with the samples it was
// fitted on.
type Validation struct {
	N                   int     `json:"n"`
	DowntimeMAPEPercent float64 `json:"downtime_mape_percent"`
	TotalMAPEPercent    float64 `json:"total_mape_percent"`
}

// FittedSet is the parameter set of one node pair and strategy.
type FittedSet struct {
	Pair      string     `json:"pair"`
	Strategy  string     `json:"strategy"` // a strategy or PooledStrategy
	Samples   int        `json:"samples"`
	Params    Params     `json:"params"`
	Relations []Relation `json:"relations"`
	// Skipped lists relations the samples could not estimate; their
	// parameters keep their Table III values.
	Skipped    []string   `json:"skipped,omitempty"`
	Validation Validation `json:"validation"`
}

// FitResult is every fitted set; it is the params file of the CLI.
type FitResult struct {
	Version int         `json:"version"`
	Sets    []FittedSet `json:"sets"`
}

// FitVersion is the FitResult format version.
const FitVersion = 1

// ErrNoSamples reports a fit without usable samples.
var ErrNoSamples = errors.New("no samples")

// ErrNoParams reports a lookup of a pair without a fitted set.
var ErrNoParams = errors.New("no fitted parameters")

// Lookup returns the parameter set for a pair and strategy: the set fitted
// on that strategy, else the pair's pooled set. An empty pair matches when
// the result holds a single pair.
func (f FitResult) Lookup(pair string, s Strategy) (Params, error) {
	if pair == "" {
		pairs := f.Pairs()
		if len(pairs) != 1 {
			return Params{}, fmt.Errorf("%w: choose a pair among %v", ErrNoParams, pairs)
		}
		pair = pairs[0]
	}
	var pooled *FittedSet
	for i := range f.Sets {
		set := &f.Sets[i]
		if set.Pair != pair {
			continue
		}
		if set.Strategy == string(s) {
			return set.Params, nil
		}
		if set.Strategy == PooledStrategy {
			pooled = set
		}
	}
	if pooled == nil {
		return Params{}, fmt.Errorf("%w for pair %q", ErrNoParams, pair)
	}
	return pooled.Params, nil
}

// Pairs lists the node pairs of the result.
func (f FitResult) Pairs() []string {
	seen := map[string]bool{}
	for _, s := range f.Sets {
		seen[s.Pair] = true
	}
	return sortedKeys(seen)
}

// Fit estimates the PAM relations (Observations 1–9) and edgehop's
// extensions by least squares, for every node pair and strategy and for
// every pair pooled over its strategies. Parameters the samples cannot
// estimate keep their Table III values.
func Fit(samples []Sample) (FitResult, error) {
	if len(samples) == 0 {
		return FitResult{}, ErrNoSamples
	}
	groups := map[[2]string][]Sample{}
	for i, s := range samples {
		if err := checkSample(s); err != nil {
			return FitResult{}, fmt.Errorf("sample %d: %w", i, err)
		}
		groups[[2]string{s.Pair, s.Strategy}] = append(groups[[2]string{s.Pair, s.Strategy}], s)
		groups[[2]string{s.Pair, PooledStrategy}] = append(groups[[2]string{s.Pair, PooledStrategy}], s)
	}
	keys := make([][2]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	// The pooled set of a pair sorts first ("*" before any strategy). A
	// strategy's own set starts from it, so a relation its samples cannot
	// estimate (a lazy dump's CRIU statistics are not usable, for one)
	// keeps the value measured on this pair rather than Table III's.
	res := FitResult{Version: FitVersion}
	pooled := map[string]Params{}
	for _, k := range keys {
		base, baseName := DefaultParams(), "Table III values"
		if b, ok := pooled[k[0]]; ok && k[1] != PooledStrategy {
			base, baseName = b, "the pair's pooled fit"
		}
		set, err := fitGroup(k[0], k[1], groups[k], base, baseName)
		if err != nil {
			return FitResult{}, fmt.Errorf("fit %s %s: %w", k[0], k[1], err)
		}
		if k[1] == PooledStrategy {
			pooled[k[0]] = set.Params
		}
		res.Sets = append(res.Sets, set)
	}
	return res, nil
}

func checkSample(s Sample) error {
	st, err := ParseStrategy(s.Strategy)
	if err != nil {
		return err
	}
	switch {
	case st != StopAndCopy && st != PostCopy && st != PreCopy && st != Hybrid:
		return fmt.Errorf("%w: samples come from edgehop strategies, not %q", ErrInvalidInputs, s.Strategy)
	case s.Pair == "":
		return fmt.Errorf("%w: no pair", ErrInvalidInputs)
	case s.StateBytes <= 0:
		return fmt.Errorf("%w: state_bytes %d", ErrInvalidInputs, s.StateBytes)
	case !(s.BandwidthBps > 0):
		return fmt.Errorf("%w: bandwidth_bps %v", ErrInvalidInputs, s.BandwidthBps)
	}
	return nil
}

// point is one (x, y) observation of a relation.
type point struct {
	x    []float64
	y    float64
	size float64 // magnitude of the measurement behind y (0: y itself), for weights
}

// fitter accumulates the relations of one group.
type fitter struct {
	set *FittedSet
}

// fit runs one relation; it returns the fit and whether it was estimated.
// For a linear relation, def holds the default intercept and slopes. A
// column that did not vary cannot be told apart from the intercept: when no
// column varied, the default line is scaled to the measured mean (its shape
// kept, its level fitted); otherwise the dropped column keeps its default
// slope and its contribution is taken out of the intercept.
func (f fitter) fit(name, obs, y string, x []string, kind string, pts []point, def ...float64) (lsqResult, bool) {
	rel := Relation{Name: name, Observation: obs, Y: y, X: x, Kind: kind, N: len(pts)}
	if len(pts) == 0 {
		f.set.Skipped = append(f.set.Skipped, name)
		return lsqResult{}, false
	}
	xs := make([][]float64, len(pts))
	ys := make([]float64, len(pts))
	sizes := make([]float64, len(pts))
	for i, p := range pts {
		xs[i], ys[i], sizes[i] = p.x, p.y, p.y
		if p.size > 0 {
			sizes[i] = p.size
		}
	}
	w := relWeights(sizes)
	var r lsqResult
	var ok bool
	switch kind {
	case "constant":
		r, ok = robustWLSQ(make([][]float64, len(pts)), ys, nil, true)
		rel.X = nil
	case "ratio":
		r, ok = robustWLSQ(xs, ys, w, false)
	default:
		r, ok = robustWLSQ(xs, ys, w, true)
		if ok {
			f.keepDefaults(&r, &rel, pts, def)
		}
	}
	if !ok {
		f.set.Skipped = append(f.set.Skipped, name)
		return lsqResult{}, false
	}
	rel.Intercept, rel.RMSE = r.intercept, r.rmse
	if rel.Kind != "constant" {
		rel.Slopes = r.slopes
		rel.R2 = r.r2
	}
	f.set.Relations = append(f.set.Relations, rel)
	return r, true
}

// keepDefaults handles the columns lsq dropped (see fit).
func (f fitter) keepDefaults(r *lsqResult, rel *Relation, pts []point, def []float64) {
	means := make([]float64, len(r.used))
	var dropped, zero []string
	anyUsed := false
	for j, used := range r.used {
		for _, p := range pts {
			means[j] += p.x[j] / float64(len(pts))
		}
		switch {
		case used:
			anyUsed = true
		case means[j] == 0:
			zero = append(zero, rel.X[j])
		default:
			dropped = append(dropped, rel.X[j])
		}
	}
	for j, used := range r.used {
		if !used && means[j] == 0 && 1+j < len(def) {
			r.slopes[j] = def[1+j] // x was 0: the slope is unknown, keep the default
		}
	}
	if len(dropped) == 0 {
		switch {
		case !anyUsed:
			rel.Kind = "constant"
			rel.Note = fmt.Sprintf("%v always 0: only the intercept was estimated", zero)
		case len(zero) > 0:
			rel.Note = fmt.Sprintf("%v always 0: default slope kept", zero)
		}
		return
	}
	if len(def) < 1+len(r.used) {
		rel.Note = fmt.Sprintf("%v did not vary: absorbed in the intercept", dropped)
		return
	}
	if !anyUsed {
		level := def[0]
		for j := range r.used {
			level += def[1+j] * means[j]
		}
		if level > 0 {
			scale := r.intercept / level
			r.intercept = def[0] * scale
			for j := range r.used {
				r.slopes[j] = def[1+j] * scale
			}
			rel.Kind = "scaled"
			rel.Note = fmt.Sprintf("%v did not vary: the default line was scaled by %.4g to the measured mean", dropped, scale)
			return
		}
	}
	for j, used := range r.used {
		if !used && means[j] != 0 {
			r.intercept -= def[1+j] * means[j]
			r.slopes[j] = def[1+j]
		}
	}
	rel.Kind = "intercept"
	rel.Note = fmt.Sprintf("%v did not vary: default slopes kept, the intercept absorbs the rest", dropped)
}

func anyUsed(u []bool) bool {
	for _, b := range u {
		if b {
			return true
		}
	}
	return false
}

// eagerBytes is the state a sample dumps and restores eagerly: M for
// stop-and-copy and pre-copy, 0 for the lazy strategies.
func eagerBytes(s Sample) float64 {
	if Strategy(s.Strategy).lazy() {
		return 0
	}
	return float64(s.StateBytes)
}

func fitGroup(pair, strategy string, samples []Sample, base Params, baseName string) (FittedSet, error) {
	p := base
	p.Name = fmt.Sprintf("fit %s %s", pair, strategy)
	p.Source = fmt.Sprintf("least squares on %d samples; parameters not estimated keep %s", len(samples), baseName)
	set := FittedSet{Pair: pair, Strategy: strategy, Samples: len(samples)}
	f := fitter{set: &set}

	criu := func(key string) func(Sample) (float64, bool) {
		return func(s Sample) (float64, bool) { v, ok := s.CRIU[key]; return v, ok }
	}
	// collectSized gathers the points of a relation; size, when given, is
	// the magnitude of the measurement behind a derived y (a phase minus
	// its modelled network time), which sets the point's weight.
	collectSized := func(y func(Sample) (float64, bool), x func(Sample) []float64, keep func(Sample) bool, size func(Sample) float64) []point {
		var pts []point
		for _, s := range samples {
			if keep != nil && !keep(s) {
				continue
			}
			v, ok := y(s)
			if !ok || math.IsNaN(v) {
				continue
			}
			var xv []float64
			if x != nil {
				xv = x(s)
			}
			pt := point{x: xv, y: v}
			if size != nil {
				pt.size = size(s)
			}
			pts = append(pts, pt)
		}
		return pts
	}
	collect := func(y func(Sample) (float64, bool), x func(Sample) []float64, keep func(Sample) bool) []point {
		return collectSized(y, x, keep, nil)
	}
	ms := func(key string) func(Sample) (float64, bool) {
		return func(s Sample) (float64, bool) { v, ok := s.CRIU[key]; return v / 1000, ok }
	}
	eagerM := func(s Sample) []float64 { return []float64{eagerBytes(s)} }

	// Eq. 15, Observation 2: the freezing time is a constant β.
	if r, ok := f.fit("freeze", "eq. 15, Obs. 2: T^freeze = β", "freezing_time_us/1000", nil, "constant",
		collect(ms(KeyFreezingUs), nil, nil)); ok {
		p.BetaMs = r.intercept
	}
	// Eq. 17, Observation 3: the dump frozen time is linear in the state
	// dumped (edgehop always dumps at R_max: no soft-dirty tracking).
	if r, ok := f.fit("dump_frozen", "eq. 17, Obs. 3: T^{d,frozen} = φᵈ + Γξ(R_max)·M", "frozen_time_us/1000", []string{"eager_state_bytes"}, "linear",
		collect(ms(KeyFrozenUs), eagerM, nil), p.PhiDMs, p.GammaMsPerByte*p.Xi.Max); ok {
		p.PhiDMs = math.Max(0, r.intercept)
		p.Xi.Max = math.Max(0, r.slopes[0]) / p.GammaMsPerByte
	}
	// Eq. 20, Observation 4: memory time linear in M, within the frozen time.
	memY := func(s Sample) (float64, bool) {
		d, ok1 := s.CRIU[KeyMemdumpUs]
		w, ok2 := s.CRIU[KeyMemwriteUs]
		return (d + w) / 1000, ok1 || ok2
	}
	if r, ok := f.fit("memory", "eq. 20, Obs. 4: T^{d,mem} = δ + Λη(R_max)·M", "(memdump_time_us+memwrite_time_us)/1000", []string{"eager_state_bytes"}, "linear",
		collect(memY, eagerM, nil), p.DeltaMs, p.LambdaMsPerByte*p.Eta.Max); ok {
		p.DeltaMs = math.Max(0, r.intercept)
		if slope := r.slopes[0]; slope > p.LambdaMsPerByte { // keep eq. 21, η ≤ 1
			p.LambdaMsPerByte, p.Eta.Max = slope, 1
		} else if slope > 0 {
			p.Eta.Max = slope / p.LambdaMsPerByte
		}
	}
	// Eq. 22, Observation 5: pages written linear in M.
	if r, ok := f.fit("pages", "eq. 22, Obs. 5: N = μᵖ + νᵖ·M", "pages_written", []string{"eager_state_bytes"}, "linear",
		collect(criu(KeyPagesWritten), eagerM, nil), p.MuP, p.NuPPerByte); ok {
		p.MuP = math.Max(0, r.intercept)
		if r.slopes[0] > 0 {
			p.NuPPerByte = r.slopes[0]
			p.NuD.Max = p.NuPPerByte // Table III: νᵈ(R_max) = νᵖ
		}
	}
	if !hasEager(samples) {
		// Observation 5 for the pages a lazy dump leaves behind.
		if r, ok := f.fit("lazy_pages", "Obs. 5 for lazy dumps: pages_lazy = νᵖ·M", "pages_lazy", []string{"state_bytes"}, "ratio",
			collect(criu(KeyPagesLazy), func(s Sample) []float64 { return []float64{float64(s.StateBytes)} }, nil)); ok && r.used[0] {
			p.NuPPerByte = math.Max(0, r.slopes[0])
			p.NuD.Max = p.NuPPerByte
		}
	}
	// Eq. 26, Observation 8: restore linear in M, independent of R.
	if r, ok := f.fit("restore", "eq. 26, Obs. 8: T^r_criu = ψ + ω·M", "restore_time_us/1000", []string{"eager_state_bytes"}, "linear",
		collect(ms(KeyRestoreUs), eagerM, nil), p.PsiMs, p.OmegaMsPerByte); ok {
		p.PsiMs = math.Max(0, r.intercept)
		p.OmegaMsPerByte = math.Max(0, r.slopes[0])
	}
	// Observation 1: layer overheads are multiplicative constants. edgehop
	// drives runc directly, so α1 (Podman/runC) is 1 and α2 is fitted.
	layerCkptY := func(s Sample) (float64, bool) {
		fr, ok1 := s.PhasesMs[PhaseFreeze]
		du, ok2 := s.PhasesMs[PhaseDump]
		return fr + du, ok1 || ok2
	}
	layerCkptX := func(s Sample) []float64 {
		return []float64{(s.CRIU[KeyFreezingUs] + s.CRIU[KeyFrozenUs]) / 1000}
	}
	hasCkpt := func(s Sample) bool { _, a := s.CRIU[KeyFreezingUs]; _, b := s.CRIU[KeyFrozenUs]; return a || b }
	if r, ok := f.fit("layer_checkpoint", "eqs. 13–14, Obs. 1: freeze+dump phases = α1α2·(T^freeze + T^frozen)", "phases.freeze+phases.dump", []string{"(freezing_time_us+frozen_time_us)/1000"}, "ratio",
		collect(layerCkptY, layerCkptX, hasCkpt)); ok && r.used[0] {
		p.Alpha1, p.Alpha2 = 1, r.slopes[0]
	}
	hasRestore := func(s Sample) bool { _, ok := s.CRIU[KeyRestoreUs]; return ok }
	if r, ok := f.fit("layer_restore", "eq. 26, Obs. 1: restore phase = α3α4·T^r_criu", "phases.restore", []string{"restore_time_us/1000"}, "ratio",
		collect(phase(PhaseRestore), func(s Sample) []float64 { return []float64{s.CRIU[KeyRestoreUs] / 1000} }, hasRestore)); ok && r.used[0] {
		p.Alpha3, p.Alpha4 = 1, r.slopes[0]
	}

	// edgehop extensions start from what the fitted PAM relations imply.
	p.DeriveExtensions()

	// Eq. 11, Observation 9: the network switch is a constant.
	if r, ok := f.fit("network_switch", "eq. 11, Obs. 9: T^ns_clear + T^ns_conf + T^flow constant", "phases.network", nil, "constant",
		collect(phase(PhaseNetwork), nil, nil)); ok {
		p.SwitchMs = math.Max(0, r.intercept)
	}
	// T^net = V/L (Sec. VI-A), extended with a fixed cost and an efficiency
	// factor; pre-copy's final transfer also hashes the dump (Diff).
	uncompressed := func(s Sample) bool { return !s.Compressed }
	xferY := func(s Sample) (float64, bool) { v, ok := s.PhasesMs[PhaseTransfer]; return v - s.RTTMs, ok }
	xferX := func(s Sample) []float64 {
		down := float64(s.BytesOnWire) - s.CRIU[KeyPrecopyBytes] - s.CRIU[KeyLazyBytes]
		diff := 0.0
		if Strategy(s.Strategy) == PreCopy {
			diff = float64(s.StateBytes)
		}
		return []float64{NetMs(math.Max(0, down), s.BandwidthBps), diff}
	}
	if r, ok := f.fit("transfer", "T^net = V/L: transfer − RTT = fixed + factor·8V/L + diff·M", "phases.transfer−rtt_ms", []string{"8·downtime_bytes/L (ms)", "state_bytes (pre-copy)"}, "linear",
		collectSized(xferY, xferX, uncompressed, phaseSize(PhaseTransfer)), p.NetFixedMs, p.NetFactor, p.DiffMsPerByte); ok {
		p.NetFixedMs = math.Max(0, r.intercept)
		if r.slopes[0] > 0 {
			p.NetFactor = r.slopes[0]
		}
		if r.used[1] || r.slopes[1] > 0 {
			p.DiffMsPerByte = math.Max(0, r.slopes[1])
		}
	}
	netMs := func(wire, l, rtt float64) float64 { return p.NetFixedMs + rtt + p.NetFactor*NetMs(wire, l) }
	// Live pre-copy rounds: per round, reading and hashing the memory.
	roundY := func(s Sample) (float64, bool) {
		v, ok := s.PhasesMs[PhasePrecopy]
		b, okb := s.CRIU[KeyPrecopyBytes]
		if !ok || !okb || s.Iterations < 1 {
			return 0, false
		}
		n := float64(s.Iterations)
		return (v - n*(p.NetFixedMs+s.RTTMs) - p.NetFactor*NetMs(b, s.BandwidthBps)) / n, true
	}
	if r, ok := f.fit("live_round", "edgehop live round (eq. 19 without freeze): (precopy − network)/rounds = read + read_per_byte·M", "per-round precopy processing (ms)", []string{"state_bytes"}, "linear",
		collectSized(roundY, func(s Sample) []float64 { return []float64{float64(s.StateBytes)} }, uncompressed,
			func(s Sample) float64 { return s.PhasesMs[PhasePrecopy] / float64(max(1, s.Iterations)) }), p.LiveReadMs, p.LiveReadMsPerByte); ok {
		p.LiveReadMs = math.Max(0, r.intercept)
		p.LiveReadMsPerByte = math.Max(0, r.slopes[0])
	}
	// Lazy pulls: a fixed cost, processing per pulled byte and per
	// already-copied byte, and the pages the service faulted on before the
	// pull brought them, min(R·T_lazy, pulled pages) (eq. 6).
	lazyY := func(s Sample) (float64, bool) {
		v, ok := s.PhasesMs[PhaseLazy]
		b, okb := s.CRIU[KeyLazyBytes]
		if !ok || !okb {
			return 0, false
		}
		return v - netMs(b, s.BandwidthBps, s.RTTMs), true
	}
	lazyX := func(s Sample) []float64 {
		b := s.CRIU[KeyLazyBytes]
		local := 0.0
		if Strategy(s.Strategy) == Hybrid {
			local = math.Max(0, p.NuPPerByte*float64(s.StateBytes)*p.PageBytes-b)
		}
		faults := math.Min(s.DirtyRate*s.PhasesMs[PhaseLazy]/1000, b/p.PageBytes)
		return []float64{b, local, faults}
	}
	if r, ok := f.fit("lazy", "edgehop lazy pull: lazy − network = fixed + lazy_per_byte·pulled + install_per_byte·local + fault·min(R·T_lazy, pages)", "phases.lazy − network (ms)",
		[]string{"lazy_bytes", "local_bytes (hybrid)", "faulted_pages"}, "linear",
		// Every sample: compression applies to the image streams, never to
		// the pages CRIU's page server sends through the tunnel.
		collectSized(lazyY, lazyX, nil, phaseSize(PhaseLazy)), p.LazyFixedMs, p.LazyMsPerByte, p.LocalInstallMsPerByte, p.LazyFaultMsPerPage); ok {
		p.LazyFixedMs = math.Max(0, r.intercept)
		p.LazyMsPerByte = math.Max(0, r.slopes[0])
		p.LocalInstallMsPerByte = math.Max(0, r.slopes[1])
		p.LazyFaultMsPerPage = math.Max(0, r.slopes[2])
	}
	// ρ with compression on (eq. 2).
	compY := func(s Sample) (float64, bool) {
		_, ok := s.CRIU[KeyRawBytes]
		return float64(s.BytesOnWire), ok && s.Compressed
	}
	if r, ok := f.fit("compression", "eq. 2: wire bytes = ρ·raw bytes", "bytes_on_wire", []string{"raw_bytes"}, "ratio",
		collect(compY, func(s Sample) []float64 { return []float64{s.CRIU[KeyRawBytes]} }, nil)); ok && r.used[0] {
		p.CompressRatio = math.Min(1, math.Max(1e-3, r.slopes[0]))
	}
	if r, ok := f.fit("prepare", "constant phase outside downtime", "phases.prepare", nil, "constant", collect(phase(PhasePrepare), nil, nil)); ok {
		p.PrepareMs = math.Max(0, r.intercept)
	}
	if r, ok := f.fit("cleanup", "constant phase outside downtime", "phases.cleanup", nil, "constant", collect(phase(PhaseCleanup), nil, nil)); ok {
		p.CleanupMs = math.Max(0, r.intercept)
	}
	for _, s := range samples {
		p.DirtyRateMax = math.Max(p.DirtyRateMax, s.DirtyRate)
	}
	if err := p.Validate(); err != nil {
		return FittedSet{}, err
	}
	set.Params = p
	set.Validation = validate(p, samples)
	return set, nil
}

func phase(name string) func(Sample) (float64, bool) {
	return func(s Sample) (float64, bool) { v, ok := s.PhasesMs[name]; return v, ok }
}

func phaseSize(name string) func(Sample) float64 {
	return func(s Sample) float64 { return s.PhasesMs[name] }
}

func hasEager(samples []Sample) bool {
	for _, s := range samples {
		if !Strategy(s.Strategy).lazy() {
			return true
		}
	}
	return false
}

// SampleInputs returns the model inputs of a measured migration.
func SampleInputs(s Sample) Inputs {
	return Inputs{StateBytes: float64(s.StateBytes), DirtyRate: s.DirtyRate, BandwidthBps: s.BandwidthBps,
		RTTMs: s.RTTMs, Iterations: s.Iterations, Compressed: s.Compressed}
}

// validate computes the mean absolute percentage error of the set's
// predictions on its samples.
func validate(p Params, samples []Sample) Validation {
	var v Validation
	for _, s := range samples {
		pr, err := p.Predict(Strategy(s.Strategy), SampleInputs(s))
		if err != nil || s.DowntimeMs <= 0 || s.TotalMs <= 0 {
			continue
		}
		v.N++
		v.DowntimeMAPEPercent += math.Abs(pr.DowntimeMs-s.DowntimeMs) / s.DowntimeMs * 100
		v.TotalMAPEPercent += math.Abs(pr.TotalMs-s.TotalMs) / s.TotalMs * 100
	}
	if v.N > 0 {
		v.DowntimeMAPEPercent /= float64(v.N)
		v.TotalMAPEPercent /= float64(v.N)
	}
	return v
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/edgehop/edgehop/internal/model"
	"github.com/edgehop/edgehop/internal/units"
)

func init() {
	register(command{name: "model", summary: "predict, fit and plan migrations with the performance model (PAM)", run: runModel})
}

const modelUsage = `usage: edgehop model <predict|plan|fit|plot|uav> [flags]

  predict  --state-mb N --dirty-rate max|min|r=X|PAGES_PER_S --bandwidth 1gbit
           [--strategy all|stop-and-copy|pre-copy|hybrid|post-copy|pam-coat|pam-traditional|sota|arnab]
           [--iterations K] [--compress] [--rtt-ms MS] [--params FILE --pair A->B] [--json]
  plan     --state-mb N --dirty-rate ... --bandwidth ... [--max-downtime-ms MS] [--max-total-ms MS]
           [--max-rounds K] [--rtt-ms MS] [--params FILE --pair A->B] [--json]
  fit      --in samples.jsonl [--out params.json] [--json]
  plot     --out fig.svg [--figure 13|18|samples] [--samples samples.jsonl] [--params FILE --pair A->B]
  uav      [--json]   required bandwidth vs UAV speed (eq. 37, Table IV, Fig. 18)

Without --params the model uses PAM's Table II–III parameters. MB is 10^6 bytes.`

func runModel(_ context.Context, args []string) error { return modelMain(args, os.Stdout) }

func modelMain(args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, modelUsage)
	}
	switch args[0] {
	case "predict":
		return modelPredict(args[1:], out)
	case "plan":
		return modelPlan(args[1:], out)
	case "fit":
		return modelFit(args[1:], out)
	case "plot":
		return modelPlot(args[1:], out)
	case "uav":
		return modelUAV(args[1:], out)
	case "-h", "--help", "help":
		fmt.Fprintln(out, modelUsage)
		return nil
	}
	return fmt.Errorf("%w: unknown model command %q\n%s", errUsage, args[0], modelUsage)
}

// migrationFlags are the flags predict and plan share.
type migrationFlags struct {
	stateMB    float64
	stateBytes int64
	dirty      string
	bandwidth  string
	rtt        float64
	params     string
	pair       string
	json       bool
}

func (m *migrationFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&m.stateMB, "state-mb", 0, "state size M in MB (10^6 bytes)")
	fs.Int64Var(&m.stateBytes, "state-bytes", 0, "state size M in bytes (instead of --state-mb)")
	fs.StringVar(&m.dirty, "dirty-rate", "max", "dirty rate R: max, min, r=X (normalized) or pages per second")
	fs.StringVar(&m.bandwidth, "bandwidth", "1gbit", "link bandwidth L, e.g. 100mbit, 1gbit, 350Mbit")
	fs.Float64Var(&m.rtt, "rtt-ms", 0, "round-trip time between the nodes in ms")
	fs.StringVar(&m.params, "params", "", "fitted parameter file from 'edgehop model fit' (default: PAM Table III)")
	fs.StringVar(&m.pair, "pair", "", "node pair of the fitted set, e.g. node0->node1")
	fs.BoolVar(&m.json, "json", false, "print JSON")
}

// paramSource gives the parameter set of each strategy.
type paramSource struct {
	fit    *model.FitResult
	pair   string
	single model.Params
}

func (m migrationFlags) source() (paramSource, error) {
	if m.params == "" {
		return paramSource{single: model.DefaultParams()}, nil
	}
	var fr model.FitResult
	b, err := os.ReadFile(m.params)
	if err != nil {
		return paramSource{}, fmt.Errorf("read params: %w", err)
	}
	if err := json.Unmarshal(b, &fr); err != nil {
		return paramSource{}, fmt.Errorf("parse params %s: %w", m.params, err)
	}
	if fr.Version != model.FitVersion {
		return paramSource{}, fmt.Errorf("params %s: version %d, want %d", m.params, fr.Version, model.FitVersion)
	}
	return paramSource{fit: &fr, pair: m.pair}, nil
}

func (s paramSource) get(st model.Strategy) (model.Params, error) {
	if s.fit == nil {
		return s.single, nil
	}
	return s.fit.Lookup(s.pair, st)
}

// base is the set used for what does not depend on a strategy (resolving
// the dirty rate): the pooled set of the pair.
func (s paramSource) base() (model.Params, error) { return s.get(model.PooledStrategy) }

func (m migrationFlags) inputs(base model.Params) (model.Inputs, model.DirtyRate, error) {
	var in model.Inputs
	switch {
	case m.stateBytes > 0 && m.stateMB > 0:
		return in, model.DirtyRate{}, fmt.Errorf("%w: give --state-mb or --state-bytes, not both", errUsage)
	case m.stateBytes > 0:
		in.StateBytes = float64(m.stateBytes)
	case m.stateMB > 0:
		in.StateBytes = m.stateMB * 1e6
	default:
		return in, model.DirtyRate{}, fmt.Errorf("%w: --state-mb or --state-bytes is required", errUsage)
	}
	bw, err := units.ParseRate(m.bandwidth)
	if err != nil || bw == 0 {
		return in, model.DirtyRate{}, fmt.Errorf("%w: --bandwidth %q: want a positive rate such as 100mbit or 1gbit", errUsage, m.bandwidth)
	}
	in.BandwidthBps = float64(bw)
	in.RTTMs = m.rtt
	dr, err := model.ResolveDirtyRate(base, in.StateBytes, m.dirty)
	if err != nil {
		return in, model.DirtyRate{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	in.DirtyRate = dr.PagesPerSecond
	return in, dr, nil
}

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func modelPredict(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("model predict", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var mf migrationFlags
	mf.register(fs)
	strategy := fs.String("strategy", "all", "strategy to predict, or all")
	iterations := fs.Int("iterations", 1, "live rounds (pre-copy, hybrid) or dump iterations I (PAM, SotA, ARNAB)")
	compress := fs.Bool("compress", false, "compress the state on the wire")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	src, err := mf.source()
	if err != nil {
		return err
	}
	base, err := src.base()
	if err != nil {
		return err
	}
	in, dr, err := mf.inputs(base)
	if err != nil {
		return err
	}
	in.Iterations, in.Compressed = *iterations, *compress
	strategies := model.AllStrategies
	if *strategy != "all" {
		st, err := model.ParseStrategy(*strategy)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		strategies = []model.Strategy{st}
	}
	type entry struct {
		Params string `json:"params"`
		model.Prediction
	}
	var preds []entry
	for _, st := range strategies {
		p, err := src.get(st)
		if err != nil {
			return err
		}
		pin := in
		if (st == model.StopAndCopy || st == model.PostCopy) && pin.Iterations != 0 {
			pin.Iterations = 0
		}
		pr, err := p.Predict(st, pin)
		if err != nil {
			return fmt.Errorf("predict %s: %w", st, err)
		}
		preds = append(preds, entry{Params: p.Name, Prediction: pr})
	}
	if mf.json {
		return writeJSON(out, struct {
			Inputs      model.Inputs    `json:"inputs"`
			DirtyRate   model.DirtyRate `json:"dirty_rate"`
			Predictions []entry         `json:"predictions"`
		}{in, dr, preds})
	}
	fmt.Fprintf(out, "M = %.0f bytes, L = %s, R = %.0f pages/s (%s)\n", in.StateBytes, model.FormatBandwidth(in.BandwidthBps), in.DirtyRate, dr.Note)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\titer\tdowntime ms\ttotal ms\tsplit ms\twire MB\tparams\t")
	for _, e := range preds {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%s\t\n", e.Strategy, e.Iterations, e.DowntimeMs, e.TotalMs, e.SplitMs, e.BytesOnWire/1e6, e.Params)
	}
	return tw.Flush()
}

// planOutput is what 'model plan' prints.
type planOutput struct {
	Strategy   model.Strategy `json:"strategy"`
	Parameters struct {
		Iterations  int  `json:"iterations"`
		Compression bool `json:"compression"`
	} `json:"parameters"`
	Predicted struct {
		DowntimeMs  float64 `json:"downtime_ms"`
		TotalMs     float64 `json:"total_ms"`
		SplitMs     float64 `json:"split_ms"`
		BytesOnWire float64 `json:"bytes_on_wire"`
	} `json:"predicted"`
	Feasible                  bool            `json:"feasible"`
	Unmet                     []string        `json:"unmet,omitempty"`
	RequiredBandwidthBps      float64         `json:"required_bandwidth_bps,omitempty"`
	RequiredBandwidthStrategy model.Strategy  `json:"required_bandwidth_strategy,omitempty"`
	Reason                    string          `json:"reason"`
	Params                    string          `json:"params"`
	Inputs                    model.Inputs    `json:"inputs"`
	DirtyRate                 model.DirtyRate `json:"dirty_rate"`
	Targets                   struct {
		MaxDowntimeMs float64 `json:"max_downtime_ms,omitempty"`
		MaxTotalMs    float64 `json:"max_total_ms,omitempty"`
	} `json:"targets"`
	// Paper is what PAM itself says of the same migration under COAT
	// (eqs. 31–33), for reference.
	Paper      paperReference    `json:"paper_reference"`
	Candidates []model.Candidate `json:"candidates"`
}

type paperReference struct {
	NormalizedRate    float64 `json:"normalized_rate"`
	COATDowntimeMs    float64 `json:"pam_coat_downtime_ms"`
	COATMigrationMs   float64 `json:"pam_coat_migration_ms_i0"`
	Eq33BandwidthBps  float64 `json:"eq33_required_bandwidth_bps,omitempty"`
	Eq33Note          string  `json:"eq33_note,omitempty"`
	Eq34MaxIterations *int    `json:"eq34_max_iterations,omitempty"`
	Eq34Note          string  `json:"eq34_note,omitempty"`
}

func modelPlan(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("model plan", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var mf migrationFlags
	mf.register(fs)
	maxDown := fs.Float64("max-downtime-ms", 0, "maximum downtime in ms (0: no target)")
	maxTotal := fs.Float64("max-total-ms", 0, "maximum total migration time in ms (0: no target)")
	maxRounds := fs.Int("max-rounds", model.DefaultMaxRounds, "most live rounds to consider for pre-copy and hybrid")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *maxDown == 0 && *maxTotal == 0 {
		return fmt.Errorf("%w: give --max-downtime-ms and/or --max-total-ms", errUsage)
	}
	src, err := mf.source()
	if err != nil {
		return err
	}
	base, err := src.base()
	if err != nil {
		return err
	}
	in, dr, err := mf.inputs(base)
	if err != nil {
		return err
	}
	req := model.Request{Inputs: in, MaxDowntimeMs: *maxDown, MaxTotalMs: *maxTotal, MaxRounds: *maxRounds,
		ByStrategy: map[model.Strategy]model.Params{}}
	for _, st := range model.EdgehopStrategies {
		p, err := src.get(st)
		if err != nil {
			return err
		}
		req.ByStrategy[st] = p
	}
	res, err := model.Plan(base, req)
	if err != nil {
		return err
	}
	var o planOutput
	o.Strategy = res.Choice.Strategy
	o.Parameters.Iterations, o.Parameters.Compression = res.Choice.Iterations, res.Choice.Compressed
	pr := res.Choice.Prediction
	o.Predicted.DowntimeMs, o.Predicted.TotalMs, o.Predicted.SplitMs, o.Predicted.BytesOnWire = pr.DowntimeMs, pr.TotalMs, pr.SplitMs, pr.BytesOnWire
	o.Feasible, o.Unmet, o.Reason = res.Feasible, res.Unmet, res.Reason
	o.RequiredBandwidthBps, o.RequiredBandwidthStrategy = res.RequiredBandwidthBps, res.RequiredBandwidthStrategy
	o.Params = res.Choice.Params
	o.Inputs, o.DirtyRate = in, dr
	o.Targets.MaxDowntimeMs, o.Targets.MaxTotalMs = *maxDown, *maxTotal
	o.Paper = paperRef(base, in, *maxDown, *maxTotal)
	o.Candidates = res.Candidates
	if mf.json {
		return writeJSON(out, o)
	}
	verdict := "meets the targets"
	if !o.Feasible {
		verdict = "MISSES " + strings.Join(o.Unmet, ", ")
	}
	fmt.Fprintf(out, "strategy:   %s (%s)\n", o.Strategy, verdict)
	fmt.Fprintf(out, "parameters: iterations=%d compression=%v\n", o.Parameters.Iterations, o.Parameters.Compression)
	fmt.Fprintf(out, "predicted:  downtime %.1f ms, total %.1f ms, split %.1f ms, %.1f MB on the wire\n", pr.DowntimeMs, pr.TotalMs, pr.SplitMs, pr.BytesOnWire/1e6)
	if o.RequiredBandwidthBps > 0 {
		fmt.Fprintf(out, "needs:      %s with %s\n", model.FormatBandwidth(o.RequiredBandwidthBps), o.RequiredBandwidthStrategy)
	}
	fmt.Fprintf(out, "dirty rate: %s\n", dr.Note)
	fmt.Fprintf(out, "why:        %s\n", o.Reason)
	return nil
}

func paperRef(p model.Params, in model.Inputs, maxDown, maxTotal float64) paperReference {
	r := p.NormalizedRate(in.StateBytes, in.DirtyRate)
	ref := paperReference{
		NormalizedRate:  r,
		COATDowntimeMs:  p.COATDowntimeMs(in.StateBytes, r, in.BandwidthBps),
		COATMigrationMs: p.COATMigrationMs(in.StateBytes, r, in.BandwidthBps, 0),
	}
	if maxDown > 0 {
		if l, err := p.RequiredBandwidth(in.StateBytes, r, maxDown); err != nil {
			ref.Eq33Note = err.Error()
		} else {
			ref.Eq33BandwidthBps = l
		}
	}
	if maxTotal > 0 {
		if n, err := p.MaxIterations(in.StateBytes, r, in.BandwidthBps, maxTotal); err != nil {
			ref.Eq34Note = err.Error()
		} else {
			ref.Eq34MaxIterations = &n
		}
	}
	return ref
}

func readSamples(path string) ([]model.Sample, error) {
	var r io.Reader
	if path == "-" {
		r = os.Stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read samples: %w", err)
		}
		defer f.Close()
		r = f
	}
	var samples []model.Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" {
			continue
		}
		var s model.Sample
		if err := json.Unmarshal([]byte(t), &s); err != nil {
			return nil, fmt.Errorf("samples %s line %d: %w", path, line, err)
		}
		samples = append(samples, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read samples %s: %w", path, err)
	}
	return samples, nil
}

func modelFit(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("model fit", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	in := fs.String("in", "", "samples, one JSON Sample per line (- for stdin)")
	outPath := fs.String("out", "", "write the fitted parameter file here")
	asJSON := fs.Bool("json", false, "print the fit result as JSON")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *in == "" {
		return fmt.Errorf("%w: --in is required", errUsage)
	}
	samples, err := readSamples(*in)
	if err != nil {
		return err
	}
	res, err := model.Fit(samples)
	if err != nil {
		return err
	}
	if *outPath != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("encode params: %w", err)
		}
		if err := os.WriteFile(*outPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write params: %w", err)
		}
	}
	if *asJSON {
		return writeJSON(out, res)
	}
	for _, set := range res.Sets {
		fmt.Fprintf(out, "%s %s: %d samples, in-sample error downtime %.1f%% total %.1f%%\n",
			set.Pair, set.Strategy, set.Samples, set.Validation.DowntimeMAPEPercent, set.Validation.TotalMAPEPercent)
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, r := range set.Relations {
			r2 := "-"
			if r.R2 != nil {
				r2 = fmt.Sprintf("%.4f", *r.R2)
			}
			fmt.Fprintf(tw, "  %s\t%s\tintercept %.4g\tslopes %v\tR² %s\trmse %.3g\tn %d\t\n", r.Name, r.Kind, r.Intercept, fmtSlopes(r.Slopes), r2, r.RMSE, r.N)
		}
		tw.Flush()
		if len(set.Skipped) > 0 {
			fmt.Fprintf(out, "  kept Table III for: %s\n", strings.Join(set.Skipped, ", "))
		}
	}
	return nil
}

func fmtSlopes(s []float64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprintf("%.4g", v)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func modelPlot(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("model plot", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var mf migrationFlags
	mf.register(fs)
	figure := fs.String("figure", "", "13 (PAM vs SotA), 18 (UAV) or samples (default: samples when --samples is given, else 13)")
	samplesPath := fs.String("samples", "", "measured samples (JSON lines) to draw against the model")
	outPath := fs.String("out", "", "SVG file to write")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *outPath == "" {
		return fmt.Errorf("%w: --out is required", errUsage)
	}
	if *figure == "" {
		*figure = "13"
		if *samplesPath != "" {
			*figure = "samples"
		}
	}
	src, err := mf.source()
	if err != nil {
		return err
	}
	var svg []byte
	switch *figure {
	case "13":
		p, err := src.base()
		if err != nil {
			return err
		}
		svg = model.Fig13(p).SVG()
	case "18":
		p, err := src.base()
		if err != nil {
			return err
		}
		_, fig, err := model.Fig18(p, model.DefaultUAV())
		if err != nil {
			return err
		}
		svg = fig.SVG()
	case "samples":
		if *samplesPath == "" {
			return fmt.Errorf("%w: --figure samples needs --samples", errUsage)
		}
		samples, err := readSamples(*samplesPath)
		if err != nil {
			return err
		}
		fig, err := model.SamplesFigure(src.get, samples)
		if err != nil {
			return err
		}
		svg = fig.SVG()
	default:
		return fmt.Errorf("%w: --figure %q: want 13, 18 or samples", errUsage, *figure)
	}
	if err := os.WriteFile(*outPath, svg, 0o644); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	fmt.Fprintf(out, "wrote %s\n", *outPath)
	return nil
}

func modelUAV(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("model uav", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	params := fs.String("params", "", "fitted parameter file (default: PAM Table III)")
	pair := fs.String("pair", "", "node pair of the fitted set")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	src, err := migrationFlags{params: *params, pair: *pair}.source()
	if err != nil {
		return err
	}
	p, err := src.base()
	if err != nil {
		return err
	}
	variants, _, err := model.Fig18(p, model.DefaultUAV())
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(out, struct {
			Params   string             `json:"params"`
			Table4   model.UAV          `json:"table_iv"`
			Variants []model.UAVVariant `json:"variants"`
		}{p.Name, model.DefaultUAV(), variants})
	}
	fmt.Fprintf(out, "required bandwidth (Mbit/s) vs UAV speed, eq. 37, Table IV, parameters %s; '-' = no bandwidth is enough\n", p.Name)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "v m/s\t")
	for _, v := range variants {
		fmt.Fprintf(tw, "%s %s\t", v.Panel, v.Label)
	}
	fmt.Fprintln(tw)
	for i, s := range model.Fig18Speeds() {
		if math.Mod(s, 1) != 0 && math.Mod(s, 1) != 0.5 {
			continue
		}
		fmt.Fprintf(tw, "%.1f\t", s)
		for _, v := range variants {
			if pt := v.Points[i]; pt.Feasible {
				fmt.Fprintf(tw, "%.2f\t", pt.RequiredBps/1e6)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/edgehop/edgehop/internal/bench"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
)

func init() { benches["pam"] = benchPam }

// benchPam runs DPRGen migrations over the grid of the issue, fits the
// models on half of them and prints each model's error on the other half.
func benchPam(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench pam", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "reduced grid: M ∈ {10, 50, 100} MB on 1 Gbit/s, 4 migrations per container (about 3 minutes)")
	asJSON := fs.Bool("json", false, "print the report as JSON (per-model errors and the raw samples)")
	samplesOut := fs.String("samples", "", "also write the samples as JSONL to this file (input of 'edgehop model fit')")
	root := fs.String("root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root (env EDGEHOP_ROOT)")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", "/var/lib/edgehop/images"), "OCI image cache (env EDGEHOP_IMAGES)")
	dprgen := fs.String("dprgen", "", "static dprgen binary for the image (default: dprgen next to this executable)")
	states := fs.String("states", "", "state sizes M in MB, comma-separated (overrides the grid)")
	rates := fs.String("rates", "", "dirty rates: min,max (overrides the grid)")
	links := fs.String("links", "", "node link rates, e.g. 100mbit,1gbit (overrides the grid)")
	strategies := fs.String("strategies", "", "strategies to try, e.g. stop-and-copy,post-copy (overrides the grid)")
	reps := fs.Int("reps", 0, "migrations per container, alternating direction; even ones fit, odd ones test (default 2, --quick 4)")
	from := fs.String("from", "", "re-analyse the runs and samples of a saved --json report instead of migrating")
	verbose := fs.Bool("v", false, "log progress")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %v", errUsage, fs.Args())
	}
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			return err
		}
		var rep bench.PAMReport
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("%s: %w", *from, err)
		}
		bench.AnalysePAM(&rep)
		return pamOutput(&rep, *asJSON, *samplesOut)
	}
	cfg := bench.DefaultPAMConfig(*quick)
	var err error
	if *states != "" {
		if cfg.StatesMB, err = pamParseFloats(*states); err != nil {
			return fmt.Errorf("%w: --states: %v", errUsage, err)
		}
	}
	if *rates != "" {
		cfg.Rates = strings.Split(*rates, ",")
	}
	if *links != "" {
		cfg.LinksBps = nil
		for _, l := range strings.Split(*links, ",") {
			bps, err := units.ParseRate(strings.TrimSpace(l))
			if err != nil {
				return fmt.Errorf("%w: --links: %v", errUsage, err)
			}
			cfg.LinksBps = append(cfg.LinksBps, bps)
		}
	}
	if *strategies != "" {
		cfg.Strategies = strings.Split(*strategies, ",")
	}
	if *reps != 0 {
		cfg.Reps = *reps
	}
	if err := requireSetup(); err != nil {
		return err
	}
	bin, err := selfBinary()
	if err != nil {
		return err
	}
	cfg.Root, cfg.ImageRoot, cfg.Binary, cfg.DPRGenBinary = *root, *images, bin, *dprgen
	if cfg.DPRGenBinary == "" {
		cfg.DPRGenBinary = filepath.Join(filepath.Dir(bin), "dprgen")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	largest := 0.0
	for _, m := range cfg.StatesMB {
		largest = max(largest, m)
	}
	if err := warmMachine(int64(largest * 1e6)); err != nil {
		return err
	}
	cfg.Log = logger(*verbose)
	cfg.Progress = func(r bench.PAMRun) {
		res := fmt.Sprintf("downtime %.1f ms, total %.1f ms, memory %s", r.DowntimeMs, r.TotalMs, r.Check)
		if !r.OK {
			res = "failed: " + r.Error
		}
		fmt.Fprintf(os.Stderr, "bench pam: run %d: M=%g MB R=%s L=%s %s %s→%s: %s\n",
			r.Index, r.StateMB, r.Rate, units.FormatRate(r.LinkBps), r.Strategy, r.From, r.To, res)
	}

	rep, err := bench.RunPAM(ctx, cfg)
	if err != nil {
		return err
	}
	return pamOutput(rep, *asJSON, *samplesOut)
}

// pamOutput prints the report, writes the samples when asked, and fails
// when DPRGen's memory did not verify after some migration.
func pamOutput(rep *bench.PAMReport, asJSON bool, samplesOut string) error {
	if samplesOut != "" {
		if err := pamWriteSamples(samplesOut, rep); err != nil {
			return err
		}
	}
	var err error
	if asJSON {
		err = printJSON(rep)
	} else {
		err = rep.WriteText(os.Stdout)
	}
	if err != nil {
		return err
	}
	if rep.MemoryBad > 0 {
		return fmt.Errorf("DPRGen's memory did not verify after %d migrations", rep.MemoryBad)
	}
	return nil
}

func pamWriteSamples(path string, rep *bench.PAMReport) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, s := range rep.Samples {
		if err := enc.Encode(s); err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(w.Flush(), f.Close())
}

func pamParseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

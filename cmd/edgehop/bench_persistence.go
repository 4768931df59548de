package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/edgehop/edgehop/internal/bench"
	"github.com/edgehop/edgehop/internal/testbed"
)

func init() { benches["persistence"] = benchPersistence }

// benchPersistence reproduces H-Container Figs. 2 and 4: a Redis moved
// between two nodes by live migration and by its own persistence (save,
// copy, restart, load), with the downtime its client sees.
func benchPersistence(ctx context.Context, args []string) error {
	def := bench.DefaultPersistenceConfig()
	fs := flag.NewFlagSet("bench persistence", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "two small datasets (16 and 128 MB)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	sizes := fs.String("sizes", joinInts(def.SizesMB), "dataset sizes in MB, comma-separated")
	valueSize := fs.Int("value-size", def.ValueBytes, "bytes per redis value")
	strategies := fs.String("strategies", strings.Join(def.Strategies, ","), "edgehop strategies, comma-separated")
	root := fs.String("root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root (env EDGEHOP_ROOT)")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", def.ImageRoot), "OCI image cache (env EDGEHOP_IMAGES)")
	verbose := fs.Bool("v", false, "log progress")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := def
	cfg.Quick, cfg.Root, cfg.ImageRoot, cfg.Log, cfg.ValueBytes = *quick, *root, *images, logger(*verbose), *valueSize
	cfg.Strategies = strings.Split(*strategies, ",")
	cfg.SizesMB = nil
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--sizes: %q is not a whole number of MB", s)
		}
		cfg.SizesMB = append(cfg.SizesMB, n)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("bench persistence: %w", err)
	}
	if err := requireSetup(); err != nil {
		return err
	}
	bin, err := selfBinary()
	if err != nil {
		return err
	}
	cfg.Binary = bin
	cfg.Progress = func(r bench.PersistenceRow) {
		res := fmt.Sprintf("downtime %.1f ms, total %.1f ms", r.DowntimeMs, r.TotalMs)
		if !r.OK {
			res = "failed: " + r.Error
		}
		fmt.Fprintf(os.Stderr, "bench persistence: %d MB %s: %s\n", r.SizeMB, r.Method, res)
	}
	rep, err := bench.RunPersistence(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(rep)
	}
	return rep.WriteText(os.Stdout)
}

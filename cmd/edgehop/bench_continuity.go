package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/edgehop/edgehop/internal/bench"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

func init() {
	benches["continuity"] = benchContinuity
}

// benchContinuity brings up its own two-node testbed, measures the
// client-visible gap of edgehop's migrations and of podman's
// checkpoint/restore path on it, and tears it down.
func benchContinuity(ctx context.Context, args []string) error {
	def := bench.DefaultConfig()
	fs := flag.NewFlagSet("bench continuity", flag.ContinueOnError)
	root := fs.String("root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root for the benchmark's testbed (env EDGEHOP_ROOT)")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", def.ImageRoot), "OCI image cache (env EDGEHOP_IMAGES)")
	strategy := fs.String("strategy", string(def.Strategy), "edgehop strategy: stop-and-copy | post-copy | auto")
	runs := fs.Int("runs", def.Runs, "migrations per path (back and forth between node0 and node1)")
	pause := fs.Duration("pause", def.Pause, "pause between migrations")
	baseline := fs.Bool("baseline", def.Baseline, "also measure podman checkpoint/restore")
	sweep := fs.Bool("sweep", false, "also migrate a redis holding each of --sizes MB, for every path")
	sizes := fs.String("sizes", joinInts(def.SizesMB), "sweep sizes in MB, comma-separated")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("v", false, "log progress to stderr")
	var nl, cl linkFlags
	nl.register(fs, "node-", def.NodeLink)
	cl.register(fs, "client-", def.ClientLink)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: bench continuity takes no arguments", errUsage)
	}
	cfg := def
	var err error
	if cfg.Strategy, err = migration.ParseStrategy(*strategy); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if cfg.SizesMB, err = parseInts(*sizes); err != nil {
		return fmt.Errorf("%w: --sizes: %v", errUsage, err)
	}
	if cfg.NodeLink, err = nl.link(); err != nil {
		return fmt.Errorf("%w: node link: %v", errUsage, err)
	}
	if cfg.ClientLink, err = cl.link(); err != nil {
		return fmt.Errorf("%w: client link: %v", errUsage, err)
	}
	cfg.Root, cfg.ImageRoot, cfg.Runs, cfg.Pause, cfg.Baseline, cfg.Sweep = *root, *images, *runs, *pause, *baseline, *sweep
	cfg.Log = logger(*verbose)
	if cfg.Pause < cfg.Window {
		cfg.Window = cfg.Pause
	}
	if cfg.Binary, err = selfBinary(); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := requireSetup(); err != nil {
		return err
	}
	largest := int64(64 << 20)
	if cfg.Sweep {
		for _, mb := range cfg.SizesMB {
			largest = max(largest, int64(mb)<<20)
		}
	}
	if err := warmMachine(largest); err != nil {
		return err
	}
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(rep)
	}
	return rep.WriteText(os.Stdout)
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/edgehop/edgehop/internal/bench"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
)

func init() { benches["cloudhopper"] = benchCloudhopper }

// benchCloudhopper reproduces CloudHopper's experiment (Table III):
// WordPress and MariaDB migrated as one group across a WAN link under
// increasing numbers of clients writing through the REST API.
func benchCloudhopper(ctx context.Context, args []string) error {
	def := bench.DefaultCloudhopperConfig()
	fs := flag.NewFlagSet("bench cloudhopper", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "idle, 10 and 50 clients, shorter load windows")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	clients := fs.String("clients", joinInts(def.Clients), "concurrency levels, comma-separated (0: idle)")
	strategy := fs.String("strategy", def.Strategy, "migration strategy")
	pod := fs.Bool("pod", false, "run the application as a pod (one namespace and address; WordPress reaches MariaDB at 127.0.0.1) rather than a group of two addresses")
	rate := fs.String("rate", "100mbit", "node-to-node link rate")
	rtt := fs.Duration("rtt", 30*time.Millisecond, "node-to-node round-trip time")
	warmup := fs.Duration("warmup", def.Warmup, "load before each migration")
	tailD := fs.Duration("tail", def.Tail, "load after each migration")
	root := fs.String("root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root (env EDGEHOP_ROOT)")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", def.ImageRoot), "OCI image cache (env EDGEHOP_IMAGES)")
	verbose := fs.Bool("v", false, "log progress")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := def
	cfg.Quick, cfg.Root, cfg.ImageRoot, cfg.Log, cfg.Strategy = *quick, *root, *images, logger(*verbose), *strategy
	cfg.Warmup, cfg.Tail, cfg.Pod = *warmup, *tailD, *pod
	if *quick {
		cfg.Warmup, cfg.Tail = min(cfg.Warmup, 5*time.Second), min(cfg.Tail, 3*time.Second)
	}
	var err error
	if cfg.Clients, err = parseInts(*clients); err != nil {
		return fmt.Errorf("--clients: %w", err)
	}
	bps, err := units.ParseRate(*rate)
	if err != nil {
		return fmt.Errorf("--rate: %w", err)
	}
	cfg.NodeLink = testbed.Link{RateBps: bps, Delay: *rtt / 4}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("bench cloudhopper: %w", err)
	}
	if err := requireSetup(); err != nil {
		return err
	}
	if cfg.Binary, err = selfBinary(); err != nil {
		return err
	}
	cfg.Progress = func(r bench.CloudhopperRun) {
		res := fmt.Sprintf("downtime %.1f ms, total %.1f ms, %d requests, %d failed, %d not 2xx, slowest %.0f ms",
			r.DowntimeMs, r.TotalMs, r.Requests, r.FailedRequests, r.NonOK, r.MaxLatencyMs)
		if !r.OK {
			res += "; FAILED: " + r.Error
		}
		fmt.Fprintf(os.Stderr, "bench cloudhopper: %d clients: %s\n", r.Clients, res)
	}
	rep, err := bench.RunCloudhopper(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(rep)
	}
	return rep.WriteText(os.Stdout)
}

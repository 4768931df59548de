package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/edgehop/edgehop/internal/bench"
	"github.com/edgehop/edgehop/internal/testbed"
)

func init() { benches["arnab"] = benchARNAB }

// benchARNAB reproduces ARNAB Fig. 6: a small service and the 1.2 GB RAM
// simulation at 5, 10 and 20 % dirty, migrated with every edgehop strategy
// and with ARNAB's own rsync method, in one run.
func benchARNAB(ctx context.Context, args []string) error {
	def := bench.DefaultARNABConfig()
	fs := flag.NewFlagSet("bench arnab", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "reduced grid: 14 MB and 300 MB at 20% dirty (a few minutes)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	strategies := fs.String("strategies", strings.Join(def.Strategies, ","), "strategies, comma-separated ("+bench.RsyncMethod+" is ARNAB's own method)")
	rounds := fs.Int("rsync-rounds", def.RsyncRounds, "checkpoints the rsync method ships while the service runs")
	root := fs.String("root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root (env EDGEHOP_ROOT)")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", def.ImageRoot), "OCI image cache (env EDGEHOP_IMAGES)")
	verbose := fs.Bool("v", false, "log progress")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *rounds < 0 {
		return fmt.Errorf("%w: --rsync-rounds %d < 0", errUsage, *rounds)
	}
	cfg := def
	cfg.Quick, cfg.RsyncRounds, cfg.Root, cfg.ImageRoot, cfg.Log = *quick, *rounds, *root, *images, logger(*verbose)
	cfg.Strategies = strings.Split(*strategies, ",")
	if err := requireSetup(); err != nil {
		return err
	}
	bin, err := selfBinary()
	if err != nil {
		return err
	}
	cfg.Binary = bin
	largest := int64(1200e6)
	if cfg.Quick {
		largest = 300e6
	}
	if err := warmMachine(largest); err != nil {
		return err
	}
	cfg.Progress = func(c bench.ARNABCase) {
		res := fmt.Sprintf("downtime %.1f ms, total %.1f ms, %d bytes, memory %s", c.DowntimeMs, c.TotalMs, c.BytesOnWire, c.Memory)
		if !c.OK {
			res = "failed: " + c.Error
		}
		fmt.Fprintf(os.Stderr, "bench arnab: %s %.0f MB %.0f%% dirty: %s\n", c.Strategy, c.StateMB, c.DirtyPct, res)
	}
	rep, err := bench.RunARNAB(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(rep)
	}
	return rep.WriteText(os.Stdout)
}

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

func init() { benches["teka"] = benchTeka }

// benchTeka reproduces Teka et al. Tables 6–7: total time and downtime of a
// 263 MB service over RTT × bandwidth, beside the paper's and the physical
// limit.
func benchTeka(ctx context.Context, args []string) error {
	def := bench.DefaultTekaConfig()
	fs := flag.NewFlagSet("bench teka", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "the four corners of the grid only")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	strategies := fs.String("strategies", strings.Join(def.Strategies, ","), "strategies, comma-separated")
	root := fs.String("root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root (env EDGEHOP_ROOT)")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", def.ImageRoot), "OCI image cache (env EDGEHOP_IMAGES)")
	verbose := fs.Bool("v", false, "log progress")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := def
	cfg.Quick, cfg.Root, cfg.ImageRoot, cfg.Log = *quick, *root, *images, logger(*verbose)
	cfg.Strategies = strings.Split(*strategies, ",")
	if err := requireSetup(); err != nil {
		return err
	}
	bin, err := selfBinary()
	if err != nil {
		return err
	}
	cfg.Binary = bin
	if err := warmMachine(263e6); err != nil {
		return err
	}
	cfg.Progress = func(c bench.TekaCell) {
		res := fmt.Sprintf("total %.0f ms (limit %.0f, paper %.0f), downtime %.1f ms (paper %.1f)", c.TotalMs, c.LimitMs, c.PaperTotalMs, c.DowntimeMs, c.PaperDowntimeMs)
		if !c.OK {
			res = "failed: " + c.Error
		}
		fmt.Fprintf(os.Stderr, "bench teka: %s RTT %.0f ms %.0f Mbit/s: %s\n", c.Strategy, c.RTTMs, c.BWMbps, res)
	}
	rep, err := bench.RunTeka(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(rep)
	}
	return rep.WriteText(os.Stdout)
}

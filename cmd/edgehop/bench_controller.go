package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/edgehop/edgehop/internal/bench"
)

func init() { benches["controller"] = benchController }

// benchController drives the controller's decision loop with simulated
// measurements and reports its decision latency.
func benchController(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench controller", flag.ContinueOnError)
	def := bench.DefaultControllerConfig()
	nodes := fs.Int("nodes", def.Nodes, "edge nodes")
	users := fs.Int("users", def.Users, "users, one update each per second")
	dur := fs.Duration("duration", def.Duration, "measured run")
	cores := fs.Int("cores", def.Cores, "GOMAXPROCS during the run")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := def
	cfg.Nodes, cfg.Users, cfg.Duration, cfg.Cores = *nodes, *users, *dur, *cores
	rep, err := bench.RunController(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(rep)
	}
	fmt.Printf("%d nodes, %d users, %d core(s), %.1f s: %d updates (%.0f/s of %.0f/s offered)\n",
		rep.Nodes, rep.Users, rep.Cores, rep.DurationS, rep.Updates, rep.UpdatesPS, rep.OfferedPS)
	fmt.Printf("decision latency p50 %.3f ms, p99 %.3f ms, max %.1f ms; %d handoffs, %d migrations %v\n",
		rep.DecisionMs.P50, rep.DecisionMs.P99, rep.DecisionMs.Max, rep.Handoffs, rep.Migrations, rep.ByPolicy)
	fmt.Printf("goal (%s): met %t\n", rep.Goal, rep.GoalMet)
	return nil
}

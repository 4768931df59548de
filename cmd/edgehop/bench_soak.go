package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/bench"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

func init() {
	benches["soak"] = benchSoak
}

// benchSoak migrates the probe, redis and memcached (as nobody) across
// three nodes under client load, cycling through the strategies, and
// reports failures, resets and lost or duplicated bytes and keys.
func benchSoak(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench soak", flag.ContinueOnError)
	root := fs.String("root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root for the soak's testbed (env EDGEHOP_ROOT)")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", image.DefaultRoot), "OCI image cache (env EDGEHOP_IMAGES)")
	n := fs.Int("migrations", 100, "migrations in all (the services take turns)")
	strategies := fs.String("strategies", "stop-and-copy,pre-copy,post-copy,hybrid", "strategies to cycle through, comma-separated")
	pause := fs.Duration("pause", 100*time.Millisecond, "pause between migrations")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	verbose := fs.Bool("v", false, "log progress to stderr")
	chaos := fs.Bool("chaos", false, "inject faults: kill (SIGKILL) the source's or the destination's agent at a random moment, or cut a node's link for a random short time")
	faultP := fs.Float64("fault-probability", 1, "with --chaos: probability that a migration gets a fault (1: every one, the kinds taking turns)")
	seed := fs.Int64("seed", 0, "with --chaos: seed of the faults' plan (0: from the clock; the report names it)")
	cases := fs.String("cases", filepath.Join(os.TempDir(), "edgehop-chaos-cases"), "with --chaos: where the agents' logs of a migration that lost, duplicated or misplaced its service are kept")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: bench soak takes no arguments", errUsage)
	}
	cfg := bench.SoakConfig{Root: *root, ImageRoot: *images, Migrations: *n, Pause: *pause, Log: logger(*verbose)}
	if *chaos {
		if *seed == 0 {
			*seed = time.Now().UnixNano()
		}
		cfg.Chaos = &bench.ChaosConfig{Probability: *faultP, Seed: *seed, CaseDir: *cases}
	}
	for _, s := range strings.Split(*strategies, ",") {
		st, err := migration.ParseStrategy(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%w: --strategies: %v", errUsage, err)
		}
		cfg.Strategies = append(cfg.Strategies, st)
	}
	var err error
	if cfg.Binary, err = selfBinary(); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := requireSetup(); err != nil {
		return err
	}
	rep, err := bench.Soak(ctx, cfg)
	if rep != nil {
		if *asJSON {
			if perr := printJSON(rep); perr != nil {
				return perr
			}
		} else {
			printSoak(rep)
		}
	}
	if err != nil {
		return err
	}
	if c := rep.Chaos; c != nil {
		// Faults make rollbacks, aborts and resets expected; a service
		// lost (but by design), duplicated or misplaced, or a migration
		// that did not settle, is a failure.
		if c.Failures()+rep.DupKeys > 0 {
			return fmt.Errorf("soak --chaos: %d services lost, %d duplicated, %d misplaced, %d clients stalled, %d failed; %d duplicated keys",
				c.ServicesLost, c.Duplicated, c.Misplaced, c.ClientStalled, c.Outcomes["failed"], rep.DupKeys)
		}
		return nil
	}
	if rep.Failed+rep.RolledBack+rep.Resets+rep.LostKeys+rep.DupKeys > 0 || rep.LostBytes > 0 {
		return fmt.Errorf("soak: %d failed, %d rolled back, %d resets, %d lost bytes, %d lost and %d duplicated keys",
			rep.Failed, rep.RolledBack, rep.Resets, rep.LostBytes, rep.LostKeys, rep.DupKeys)
	}
	return nil
}

func printSoak(r *bench.SoakReport) {
	w := os.Stdout
	fmt.Fprintf(w, "soak: %d migrations in %.0f s: %d ok, %d rolled back, %d failed\n", r.Migrations, r.Seconds, r.OK, r.RolledBack, r.Failed)
	fmt.Fprintf(w, "clients: %d resets, %d lost bytes (probe), %d lost and %d duplicated keys (redis, memcached)\n",
		r.Resets, r.LostBytes, r.LostKeys, r.DupKeys)
	fmt.Fprintf(w, "acknowledged operations: probe %d, redis %d, memcached %d\n", r.Ops["probe"], r.Ops["redis"], r.Ops["mc"])
	var names []string
	for k := range r.Downtime {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		d := r.Downtime[k]
		fmt.Fprintf(w, "downtime %-14s p50 %6.1f ms  p99 %6.1f ms  max %6.1f ms\n", k, d.P50, d.P99, d.Max)
	}
	if c := r.Chaos; c != nil {
		printChaos(c)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  %s\n", e)
	}
}

func printChaos(c *bench.ChaosReport) {
	w := os.Stdout
	fmt.Fprintf(w, "chaos (seed %d, fault probability %g): %d kills (source %d, destination %d), %d link cuts (%d in the lazy window)\n",
		c.Seed, c.Probability, c.Kills, c.KillsBy["source"], c.KillsBy["destination"], c.LinkCuts, c.LinkCutsLazy)
	fmt.Fprintf(w, "kills by phase: %s\n", sortedCounts(c.KillsPhase))
	fmt.Fprintf(w, "link cuts by node and the destination's phase: %s\n", sortedCounts(c.LinkCutsPhase))
	fmt.Fprintf(w, "outcomes: %s\n", sortedCounts(c.Outcomes))
	fmt.Fprintf(w, "services lost %d (by design %d), copies duplicated %d, misplaced %d, clients stalled %d; settle p50 %.0f ms, p99 %.0f ms, longest %.0f ms\n",
		c.ServicesLost, c.LostByDesign, c.Duplicated, c.Misplaced, c.ClientStalled, c.Settle.P50, c.Settle.P99, c.LongestSettle)
}

func sortedCounts(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

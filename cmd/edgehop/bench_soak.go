package main

import (
	"context"
	"flag"
	"fmt"
	"os"
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
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: bench soak takes no arguments", errUsage)
	}
	cfg := bench.SoakConfig{Root: *root, ImageRoot: *images, Migrations: *n, Pause: *pause, Log: logger(*verbose)}
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
	for _, e := range r.Errors {
		fmt.Fprintf(w, "  %s\n", e)
	}
}

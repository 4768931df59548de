package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgehop/edgehop/internal/follow"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/testbed"
)

func init() {
	register(command{name: "demo", summary: "the main job: a service follows a user walking across three regions (report in JSON and HTML): demo [--json]", run: runDemo})
	benches["follow"] = benchFollow
}

// followFlags are the flags demo and bench follow share.
type followFlags struct {
	root, name, images, reports, kind, walk, pod *string
	speed, threshold                             *float64
	asJSON, verbose                              *bool
}

func registerFollow(fs *flag.FlagSet, def follow.Config) followFlags {
	return followFlags{
		root:      fs.String("root", envOr("EDGEHOP_ROOT", "/var/lib/edgehop"), "state root (env EDGEHOP_ROOT)"),
		name:      fs.String("testbed", def.Name, "name of the testbed the experiment brings up (and down)"),
		images:    fs.String("images", envOr("EDGEHOP_IMAGES", image.DefaultRoot), "OCI image cache"),
		reports:   fs.String("report-dir", "", "where the report goes (default: <root>/reports/<name>-<time>)"),
		kind:      fs.String("policy", def.Policy.Kind, "policy of the followed redis: latency | region | teka | throughput | model"),
		speed:     fs.Float64("speed", def.Speed, "walking speed, m/s"),
		walk:      fs.String("walk", follow.WalkLine, "the user's path: line (across every region) | border (back and forth across the first border)"),
		pod:       fs.String("pod", "", "run the followed redis as pod NAME with a replica in its namespace; the controller follows the pod"),
		threshold: fs.Float64("threshold-ms", def.Policy.ThresholdMs, "latency policy: the threshold"),
		asJSON:    fs.Bool("json", false, "print the report as JSON"),
		verbose:   fs.Bool("v", false, "log the testbed's work"),
	}
}

func (f followFlags) apply(cfg *follow.Config) error {
	if err := requireSetup(); err != nil {
		return err
	}
	bin, err := selfBinary()
	if err != nil {
		return err
	}
	cfg.Root, cfg.Binary, cfg.ImageRoot, cfg.Speed = *f.root, bin, *f.images, *f.speed
	if err := testbed.CheckName(*f.name); err != nil {
		return fmt.Errorf("--testbed: %w", err)
	}
	cfg.Name = *f.name
	if *f.kind != cfg.Policy.Kind {
		cfg.Policy = policy.Config{Kind: *f.kind, MinDwell: cfg.Policy.MinDwell}
	}
	if *f.threshold > 0 {
		cfg.Policy.ThresholdMs = *f.threshold
	}
	cfg.Walk = *f.walk
	cfg.Pod = *f.pod
	cfg.ReportDir = *f.reports
	if cfg.ReportDir == "" {
		cfg.ReportDir = filepath.Join(cfg.Root, "reports", cfg.Name+"-"+time.Now().UTC().Format("20060102-150405"))
	}
	if _, err := image.Resolve(cfg.ImageRoot, "services"); err != nil {
		return fmt.Errorf("the services image is missing (%v): build it with 'edgehop image build services' or 'make images'", err)
	}
	cfg.Log = logger(*f.verbose)
	if !*f.asJSON {
		cfg.Progress = func(line string) { fmt.Fprintln(os.Stderr, line) }
	}
	return nil
}

func runFollowExperiment(ctx context.Context, cfg follow.Config, asJSON bool) error {
	rep, err := follow.Run(ctx, cfg)
	if rep != nil {
		if asJSON {
			if perr := printJSON(rep); perr != nil {
				return perr
			}
		} else {
			fmt.Print(rep.Summary())
		}
	}
	return err
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	def := follow.DemoConfig()
	f := registerFollow(fs, def)
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := def
	if err := f.apply(&cfg); err != nil {
		return err
	}
	return runFollowExperiment(ctx, cfg, *f.asJSON)
}

// benchFollow is H-Container's Fig. 17: a user walks from the origin node
// to the destination node (latency to each rising 1 ms per 100 m, to 10 ms),
// redis follows under the throughput policy; average GET/SET throughput
// against the two fixed placements.
func benchFollow(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench follow", flag.ContinueOnError)
	def := follow.BenchConfig()
	f := registerFollow(fs, def)
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg := def
	if err := f.apply(&cfg); err != nil {
		return err
	}
	return runFollowExperiment(ctx, cfg, *f.asJSON)
}

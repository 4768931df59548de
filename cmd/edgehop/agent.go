package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/edgehop/edgehop/internal/agent"
)

func init() {
	register(command{name: "agent", summary: "run a node agent (inside the node's network namespace)", run: runAgent})
}

func runAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "agent configuration file (JSON)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *cfgPath == "" {
		return fmt.Errorf("%w: --config is required", errUsage)
	}
	cfg, err := agent.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	lvl := slog.LevelInfo
	if *verbose {
		lvl = slog.LevelDebug
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

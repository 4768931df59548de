package main

import (
	"context"
	"flag"
	"fmt"
	"os"
)

func init() {
	register(command{name: "metrics", summary: "print a node agent's Prometheus metrics: metrics --node N", run: runMetrics})
}

func runMetrics(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("metrics", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	node := fs.String("node", "", "the node whose agent to ask (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *node == "" {
		return fmt.Errorf("metrics: --node is required (see 'edgehop testbed status' for the nodes)")
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	c, err := agentOf(st, *node)
	if err != nil {
		return err
	}
	return c.Metrics(ctx, os.Stdout)
}

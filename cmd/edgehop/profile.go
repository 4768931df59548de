package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
)

func init() {
	register(command{name: "profile", summary: "record a node agent's Go CPU profile (or another pprof profile): profile --node N [--seconds S] [--kind cpu|heap|goroutine|block|mutex] --out FILE", run: runProfile})
}

// runProfile fetches a pprof profile from an agent's operator API; read it
// with `go tool pprof FILE`.
func runProfile(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("profile", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	node := fs.String("node", "", "the node whose agent to profile (required)")
	seconds := fs.Int("seconds", 10, "how long a CPU profile records")
	kind := fs.String("kind", "cpu", "cpu, or a runtime profile: heap, allocs, goroutine, block, mutex, threadcreate")
	out := fs.String("out", "", "the file to write the profile to (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *node == "" || *out == "" {
		return fmt.Errorf("%w: profile: --node and --out are required (see 'edgehop testbed status' for the nodes)", errUsage)
	}
	if *seconds < 1 || *seconds > 600 {
		return fmt.Errorf("%w: profile: --seconds %d is not within 1..600", errUsage, *seconds)
	}
	path := "/debug/pprof/profile?seconds=" + strconv.Itoa(*seconds)
	switch *kind {
	case "cpu":
	case "heap", "allocs", "goroutine", "block", "mutex", "threadcreate":
		path = "/debug/pprof/" + *kind
	default:
		return fmt.Errorf("%w: profile: unknown --kind %q (cpu, heap, allocs, goroutine, block, mutex, threadcreate)", errUsage, *kind)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	c, err := agentOf(st, *node)
	if err != nil {
		return err
	}
	f, err := os.Create(*out)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if err := c.Do(ctx, "GET", path, nil, f); err != nil {
		f.Close()
		os.Remove(*out)
		return fmt.Errorf("profile of %s: %w", *node, err)
	}
	return f.Close()
}

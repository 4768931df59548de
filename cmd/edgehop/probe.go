package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/edgehop/edgehop/internal/probe"
)

func init() {
	register(command{name: "probe", summary: "continuity probe: 'probe client ADDR' checks a probe server, 'probe serve [PORT]' runs one", run: runProbe})
}

const probeUsage = "usage: edgehop probe client [--period 5ms] [--duration 10s] [--conns 1] [--size 64] [--drain 1s] [--timeline] [--json] ADDR\n" +
	"       edgehop probe serve [PORT]"

func runProbe(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: %s", errUsage, probeUsage)
	}
	switch args[0] {
	case "client":
		return probeClient(ctx, args[1:])
	case "serve":
		return probeServe(ctx, args[1:])
	}
	return fmt.Errorf("%w: unknown probe command %q\n%s", errUsage, args[0], probeUsage)
}

func probeClient(ctx context.Context, args []string) error {
	def := probe.DefaultClientConfig()
	fs := flag.NewFlagSet("probe client", flag.ContinueOnError)
	period := fs.Duration("period", def.Period, "interval between requests on each connection")
	duration := fs.Duration("duration", def.Duration, "how long to send (0: until interrupted)")
	conns := fs.Int("conns", def.Conns, "parallel connections")
	size := fs.Int("size", def.LineSize, "bytes per request line, newline included")
	drain := fs.Duration("drain", def.Drain, "how long to wait for outstanding replies at the end")
	timeline := fs.Bool("timeline", false, "include every reply in the JSON report")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fs.Usage = func() { fmt.Fprintln(fs.Output(), probeUsage); fs.PrintDefaults() }
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want one ADDR (host:port)\n%s", errUsage, probeUsage)
	}
	cfg := probe.ClientConfig{Addr: fs.Arg(0), Period: *period, LineSize: *size, Conns: *conns,
		Duration: *duration, Drain: *drain, Timeline: *timeline}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	rep, err := probe.RunClient(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		if err := printJSON(rep); err != nil {
			return err
		}
	} else {
		fmt.Printf("%s: %d requests, %d replies, %d mismatches, %d resets, %d connection errors, %d unanswered\n",
			rep.Addr, rep.Requests, rep.Replies, rep.Mismatches, rep.Resets, rep.ConnErrors, rep.Unanswered)
		fmt.Printf("max gap %v (conn %d at %v); rtt p50 %v p99 %v max %v; %d conns for %v\n",
			rep.MaxGap.Round(10*time.Microsecond), rep.MaxGapConn, rep.MaxGapStart.Round(time.Millisecond),
			rep.RTTp50.Round(time.Microsecond), rep.RTTp99.Round(time.Microsecond), rep.RTTMax.Round(time.Microsecond),
			rep.Conns, rep.Elapsed.Round(time.Millisecond))
	}
	if p := rep.Problem(); p != "" {
		return fmt.Errorf("continuity broken: %s", p)
	}
	return nil
}

func probeServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("probe serve", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), probeUsage) }
	if err := parse(fs, args); err != nil {
		return err
	}
	port := "7000"
	switch fs.NArg() {
	case 0:
	case 1:
		port = fs.Arg(0)
	default:
		return fmt.Errorf("%w: %s", errUsage, probeUsage)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%w: bad port %q", errUsage, port)
	}
	ln, err := probe.Listen(ctx, ":"+port)
	if err != nil {
		return err
	}
	fmt.Printf("probe listening on %s\n", ln.Addr())
	return probe.Serve(ctx, ln)
}

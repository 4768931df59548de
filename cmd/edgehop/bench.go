package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/edgehop/edgehop/internal/linkemu"
	"github.com/edgehop/edgehop/internal/testbed"
)

// benches are the `edgehop bench` subcommands, registered by their files.
var benches = map[string]func(ctx context.Context, args []string) error{}

func init() {
	register(command{name: "bench", summary: "benchmarks against a baseline measured in the same run: link | continuity | soak | follow | controller | pam | arnab | teka | persistence | cloudhopper", run: runBench})
	benches["link"] = benchLink
}

func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 || benches[args[0]] == nil {
		names := ""
		for n := range benches {
			names += " " + n
		}
		return fmt.Errorf("%w: edgehop bench <name> [flags]; names:%s", errUsage, names)
	}
	return benches[args[0]](ctx, args[1:])
}

// linkRow is one measured path.
type linkRow struct {
	From           string  `json:"from"`
	To             string  `json:"to"`
	ConfiguredRTT  float64 `json:"configured_rtt_ms"` // both links' one-way delays, each way
	MeasuredRTTp50 float64 `json:"measured_rtt_p50_ms"`
	MeasuredRTTp99 float64 `json:"measured_rtt_p99_ms"`
	ConfiguredMbps float64 `json:"configured_mbps"` // the narrower link; 0 = unshaped
	MeasuredMbps   float64 `json:"measured_mbps"`
	RTTRatio       float64 `json:"rtt_ratio"`        // measured / configured
	RateRatio      float64 `json:"throughput_ratio"` // measured / configured
}

// benchLink measures RTT and throughput from one member to every node of
// the running testbed and prints them beside the configured values.
func benchLink(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench link", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	from := fs.String("from", "client0", "member the traffic starts at")
	dur := fs.Duration("duration", 3*time.Second, "bulk transfer time per path")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	src, ok := st.Member(*from)
	if !ok {
		return fmt.Errorf("unknown testbed member %q", *from)
	}
	var rows []linkRow
	for _, n := range st.Nodes {
		if n.Name == src.Name {
			continue
		}
		m, err := linkemu.Measure(ctx, linkemu.MeasureConfig{FromNS: src.NetNSPath, ToNS: n.NetNSPath, ToAddr: n.Address, Duration: *dur})
		if err != nil {
			return fmt.Errorf("measure %s -> %s: %w", src.Name, n.Name, err)
		}
		rows = append(rows, makeRow(src, n, m))
	}
	if *asJSON {
		return printJSON(map[string]any{"from": src.Name, "paths": rows})
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FROM\tTO\tRTT CONFIGURED\tRTT MEASURED p50 (p99)\tRATE CONFIGURED\tTHROUGHPUT MEASURED")
	for _, r := range rows {
		conf := "unshaped"
		if r.ConfiguredMbps > 0 {
			conf = fmt.Sprintf("%.0f Mbit/s", r.ConfiguredMbps)
		}
		fmt.Fprintf(w, "%s\t%s\t%.1f ms\t%.1f ms (%.1f)\t%s\t%.0f Mbit/s\n", r.From, r.To, r.ConfiguredRTT, r.MeasuredRTTp50, r.MeasuredRTTp99, conf, r.MeasuredMbps)
	}
	return w.Flush()
}

func makeRow(src, dst testbed.Member, m linkemu.Measurement) linkRow {
	confRTT := 2 * float64((src.Link.Delay + dst.Link.Delay).Microseconds()) / 1000
	rate := testbed.LinkPathRate(src, dst)
	r := linkRow{From: src.Name, To: dst.Name, ConfiguredRTT: confRTT,
		MeasuredRTTp50: float64(m.RTTMedian.Microseconds()) / 1000, MeasuredRTTp99: float64(m.RTTP99.Microseconds()) / 1000,
		ConfiguredMbps: float64(rate) / 1e6, MeasuredMbps: m.Mbps()}
	if confRTT > 0 {
		r.RTTRatio = r.MeasuredRTTp50 / confRTT
	}
	if rate > 0 {
		r.RateRatio = m.Throughput / float64(rate)
	}
	return r
}

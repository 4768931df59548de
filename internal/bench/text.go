package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteText renders the report as tables for a terminal.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := func(format string, a ...any) { fmt.Fprintf(tw, format, a...) }
	tb := r.Testbed
	p("testbed %s: 2 nodes on %s, %.1f ms links; client on %s, %.1f ms (one way)\n", tb.Name,
		rate(tb.NodeRateBps), tb.NodeDelayMs, rate(tb.ClientRateBps), tb.ClientDelayMs)
	p("probe: %d connection, a %d-byte request every %.0f ms; migrations %.0f ms apart; gap window: request + %.0f ms\n\n",
		r.Workload.Connections, r.Workload.LineBytes, r.Workload.PeriodMs, r.Workload.PauseMs, r.Workload.WindowMs)

	sides := []Side{r.Side}
	if r.Baseline.Available {
		sides = append(sides, r.Baseline)
	}
	p("PATH\tRUNS\tFAILED\tRESETS\tLOST BYTES\tGAP ms p50/p99/max\tDOWNTIME ms p50/p99/max\tTOTAL ms p50\tBYTES ON WIRE p50\n")
	for _, s := range sides {
		p("%s\t%d\t%d\t%d\t%d\t%s\t%s\t%.1f\t%s\n", s.Path, s.Runs, s.Failed, s.Resets, s.LostBytes,
			triple(s.GapMs), triple(s.DowntimeMs), s.TotalMs.P50, bytesText(int64(s.BytesOnWire.P50)))
	}
	if !r.Baseline.Available {
		p("%s\tunavailable: %s\n", r.Baseline.Path, r.Baseline.Reason)
	}
	p("\n")

	names := phaseNames(r.Side)
	if r.Baseline.Available {
		seen := map[string]bool{}
		for _, n := range names {
			seen[n] = true
		}
		for _, n := range phaseNames(r.Baseline) {
			if !seen[n] {
				names = append(names, n)
			}
		}
	}
	p("PHASES ms p50 (max)\t%s\n", strings.Join(names, "\t"))
	for _, s := range sides {
		cells := make([]string, len(names))
		for i, n := range names {
			if v, ok := s.PhasesMs[n]; ok {
				cells[i] = fmt.Sprintf("%.1f (%.1f)", v.P50, v.Max)
			} else {
				cells[i] = "-"
			}
		}
		p("%s\t%s\n", s.Path, strings.Join(cells, "\t"))
	}
	p("\n")
	p("ratio, gap p50 podman / edgehop:\t%s\n", ratioText(r.Ratio))
	p("ratio, downtime p50 podman / edgehop:\t%s\n\n", ratioText(r.DowntimeRatio))

	if len(r.Window) > 0 {
		p("FROZEN WINDOW (edgehop)\tms p50\tWHAT\n")
		for _, w := range r.Window {
			p("%s\t%.1f\t%s\n", w.Part, w.P50Ms, w.What)
		}
		p("\n")
	}
	p("GOAL\tTARGET\tMEASURED\tMET\n")
	for _, g := range r.Goals {
		m, met := "not measured", "-"
		if g.Measured != nil {
			m, met = fmt.Sprintf("%.1f", *g.Measured), fmt.Sprint(g.Met)
		}
		p("%s\t%s\t%s\t%s\n", g.Name, g.Target, m, met)
	}

	if len(r.Sweep) > 0 {
		p("\nSWEEP: redis filled with random %d kB values, migrated node0 -> node1 (post-copy back)\n", redisValue/1000)
		p("SIZE MB\tPATH\tDOWNTIME ms\tTOTAL ms\tSTATE\tON WIRE\tREDIS USED\tCONNECTION KEPT\tNOTE\n")
		for _, s := range r.Sweep {
			if !s.Available {
				p("%d\t%s\t-\t-\t-\t-\t-\t-\tunavailable: %s\n", s.SizeMB, s.Path, s.Reason)
				continue
			}
			note := s.Error
			if s.OK && note == "" {
				note = "ok"
			}
			p("%d\t%s\t%.1f\t%.1f\t%s\t%s\t%s\t%v\t%s\n", s.SizeMB, s.Path, s.DowntimeMs, s.TotalMs,
				bytesText(s.StateBytes), bytesText(s.BytesOnWire), bytesText(s.RedisUsedBytes), s.ConnectionKept, note)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nnotes:")
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  - %s\n", n)
	}
	return nil
}

func triple(s Summary) string { return fmt.Sprintf("%.1f / %.1f / %.1f", s.P50, s.P99, s.Max) }

func ratioText(r *float64) string {
	if r == nil {
		return "not measured"
	}
	return fmt.Sprintf("%.1fx", *r)
}

func rate(bps uint64) string {
	switch {
	case bps == 0:
		return "unshaped links"
	case bps >= 1e9 && bps%1e9 == 0:
		return fmt.Sprintf("%d Gbit/s", bps/1e9)
	}
	return fmt.Sprintf("%d Mbit/s", bps/1e6)
}

func bytesText(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

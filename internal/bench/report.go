package bench

import (
	"sort"
	"time"

	"github.com/edgehop/edgehop/internal/migration"
)

// Migration is one measured migration.
type Migration struct {
	Index       int                `json:"run"`
	Started     time.Time          `json:"started"` // when the migration was requested
	From        string             `json:"from"`
	To          string             `json:"to"`
	OK          bool               `json:"ok"`
	Error       string             `json:"error,omitempty"`
	GapMs       float64            `json:"gap_ms"`
	GapOpen     bool               `json:"gap_open,omitempty"` // no reply came after the gap: a lower bound
	GapStartMs  float64            `json:"gap_start_ms"`       // when the gap began, from the migration request
	DowntimeMs  float64            `json:"downtime_ms"`
	TotalMs     float64            `json:"total_ms"`
	PhasesMs    map[string]float64 `json:"phases_ms"`
	BytesOnWire int64              `json:"bytes_on_wire"`
	CRIU        map[string]float64 `json:"criu,omitempty"`
	// Restore is the destination's account of its part of the window.
	Restore *migration.RestoreReport `json:"restore,omitempty"`
	// Reconnected is set when the probe's connection had broken by the end
	// of this migration and a new one was opened.
	Reconnected bool `json:"reconnected,omitempty"`

	start, end time.Time // wall clock around the migration request
}

// ProbeStats is what the probe clients of one path saw in total.
type ProbeStats struct {
	Connections int      `json:"connections"` // 1 unless a connection broke and another was opened
	Requests    uint64   `json:"requests"`
	Replies     uint64   `json:"replies"`
	Unanswered  uint64   `json:"unanswered"`
	RTTp50Ms    float64  `json:"rtt_p50_ms"`
	RTTp99Ms    float64  `json:"rtt_p99_ms"`
	Errors      []string `json:"errors,omitempty"`
}

// Side is one migration path's figures over all its runs. Runs counts the
// migrations that completed; the distributions are over those.
type Side struct {
	Path        string             `json:"path"`
	Available   bool               `json:"available"`
	Reason      string             `json:"reason,omitempty"` // why the path could not be measured
	Runs        int                `json:"runs"`
	Failed      int                `json:"failed"`
	Resets      int                `json:"resets"`
	ConnErrors  int                `json:"conn_errors"`
	Mismatches  uint64             `json:"mismatches"`
	LostBytes   uint64             `json:"lost_bytes"`
	GapMs       Summary            `json:"gap_ms"`
	DowntimeMs  Summary            `json:"downtime_ms"`
	TotalMs     Summary            `json:"total_ms"`
	PhasesMs    map[string]Summary `json:"phases_ms"`
	BytesOnWire Summary            `json:"bytes_on_wire"`
	Probe       ProbeStats         `json:"probe"`
	PerRun      []Migration        `json:"per_run"`
}

// Goal is one of the benchmark's targets and whether this run met it.
type Goal struct {
	Name     string   `json:"name"`
	Target   string   `json:"target"`
	Measured *float64 `json:"measured"` // nil: not measured in this run
	Met      bool     `json:"met"`
}

// TestbedInfo describes the links the run used.
type TestbedInfo struct {
	Name          string  `json:"name"`
	NodeRateBps   uint64  `json:"node_rate_bps"` // 0 = unshaped
	NodeDelayMs   float64 `json:"node_delay_ms"` // one way, each direction
	ClientRateBps uint64  `json:"client_rate_bps"`
	ClientDelayMs float64 `json:"client_delay_ms"`
}

// Workload describes the probe traffic.
type Workload struct {
	PeriodMs    float64 `json:"period_ms"`
	LineBytes   int     `json:"line_bytes"`
	Connections int     `json:"connections"`
	PauseMs     float64 `json:"pause_ms"`  // between migrations
	WindowMs    float64 `json:"window_ms"` // gap window: the migration request plus this much after it
}

// Report is the continuity benchmark's result. edgehop's figures are at
// the top level; the podman path's are in Baseline, in the same shape.
type Report struct {
	Side
	Strategy      string   `json:"strategy"`
	Baseline      Side     `json:"baseline"`
	Ratio         *float64 `json:"ratio"`          // baseline gap p50 ÷ edgehop gap p50
	DowntimeRatio *float64 `json:"downtime_ratio"` // baseline downtime p50 ÷ edgehop downtime p50
	// Window is edgehop's frozen window split into CRIU's own time and
	// the rest of each phase (runs with CRIU's statistics only).
	Window   []WindowPart `json:"window,omitempty"`
	Goals    []Goal       `json:"goals"`
	Testbed  TestbedInfo  `json:"testbed"`
	Workload Workload     `json:"workload"`
	Sweep    []SweepRow   `json:"sweep,omitempty"`
	Notes    []string     `json:"notes"`
	Started  time.Time    `json:"started"`
	ElapsedS float64      `json:"elapsed_s"`
}

// SweepRow is one state size migrated once by one path.
type SweepRow struct {
	SizeMB         int                `json:"size_mb"` // redis values written, in 10^6 bytes
	Path           string             `json:"path"`
	Available      bool               `json:"available"`
	Reason         string             `json:"reason,omitempty"`
	OK             bool               `json:"ok"`
	Error          string             `json:"error,omitempty"`
	Keys           int                `json:"keys"`
	RedisUsedBytes int64              `json:"redis_used_bytes"` // INFO memory used_memory after the fill
	DowntimeMs     float64            `json:"downtime_ms"`
	TotalMs        float64            `json:"total_ms"`
	PhasesMs       map[string]float64 `json:"phases_ms,omitempty"`
	StateBytes     int64              `json:"state_bytes"`   // checkpoint payload as the migration result reports it (edgehop) or the exported archive (podman)
	BytesOnWire    int64              `json:"bytes_on_wire"` // between the two nodes, as the migration result reports it
	// ConnectionKept: the connection that filled redis answered PING and
	// DBSIZE (with every key) after the migration.
	ConnectionKept bool `json:"connection_kept"`
}

// summarize turns the runs of one path and what its probe clients saw
// into the path's figures. A run's gap is the longest interval without a
// reply that overlaps [start of its migration request, end + window].
func summarize(s Side, runs []Migration, o observation, window time.Duration) Side {
	s.Available = true
	s.Resets, s.ConnErrors, s.Mismatches, s.LostBytes = o.resets, o.connErrors, o.mismatches, o.lostBytes()
	s.Probe = ProbeStats{Connections: o.conns, Requests: o.requests, Replies: o.replies, Unanswered: o.unanswered,
		RTTp50Ms: ms(o.rttP50), RTTp99Ms: ms(o.rttP99), Errors: o.errors}
	var gaps, downs, totals, bytes []float64
	phases := map[string][]float64{}
	for i := range runs {
		r := &runs[i]
		g := LongestGap(o.replyTimes, r.start, r.end.Add(window), o.end)
		r.GapMs, r.GapOpen, r.GapStartMs = ms(g.Length), g.Open, ms(g.Start.Sub(r.start))
		r.Started = r.start.UTC()
		if !r.OK {
			s.Failed++
			continue
		}
		s.Runs++
		gaps = append(gaps, r.GapMs)
		downs = append(downs, r.DowntimeMs)
		totals = append(totals, r.TotalMs)
		bytes = append(bytes, float64(r.BytesOnWire))
		for k, v := range r.PhasesMs {
			phases[k] = append(phases[k], v)
		}
	}
	s.GapMs, s.DowntimeMs, s.TotalMs, s.BytesOnWire = Summarize(gaps), Summarize(downs), Summarize(totals), Summarize(bytes)
	s.PhasesMs = map[string]Summary{}
	for k, v := range phases {
		s.PhasesMs[k] = Summarize(v)
	}
	s.PerRun = runs
	return s
}

// goals evaluates the benchmark's targets on r.
func goals(r *Report) []Goal {
	var out []Goal
	add := func(name, target string, measured *float64, met func(float64) bool) {
		g := Goal{Name: name, Target: target, Measured: measured}
		if measured != nil {
			g.Met = met(*measured)
		}
		out = append(out, g)
	}
	val := func(ok bool, v float64) *float64 {
		if !ok {
			return nil
		}
		return &v
	}
	add("probe gap p50", "<= 50 ms", val(r.Runs > 0, r.GapMs.P50), func(v float64) bool { return v <= 50 })
	nw, ok := r.PhasesMs["network"]
	add("network switch p50", "<= 20 ms", val(ok && r.Runs > 0, nw.P50), func(v float64) bool { return v <= 20 })
	add("gap ratio podman/edgehop (p50)", ">= 20", r.Ratio, func(v float64) bool { return v >= 20 })
	return out
}

// phaseNames returns the phases of s in migration order, unknown ones last.
func phaseNames(s Side) []string {
	order := map[string]int{"prepare": 0, "dump": 1, "transfer": 2, "rm": 3, "restore": 4, "commit": 5, "network": 6, "cleanup": 7, "lazy": 8}
	var names []string
	for k := range s.PhasesMs {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		oi, iok := order[names[i]]
		oj, jok := order[names[j]]
		switch {
		case iok && jok:
			return oi < oj
		case iok != jok:
			return iok
		}
		return names[i] < names[j]
	})
	return names
}

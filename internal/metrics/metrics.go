package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgehop/edgehop/internal/migration"
)

// Namespace prefixes every metric name.
const Namespace = "edgehop"

// Gauges are read when scraped.
type Gauges struct {
	Containers func() int // containers on the node
	Running    func() int // migration jobs not ended
}

// Metrics is one agent's metrics. Safe for concurrent use.
type Metrics struct {
	reg        *prometheus.Registry
	started    *prometheus.CounterVec
	ended      *prometheus.CounterVec
	downtime   *prometheus.HistogramVec
	total      *prometheus.HistogramVec
	phase      *prometheus.HistogramVec
	wire       *prometheus.CounterVec
	state      *prometheus.CounterVec
	held       prometheus.Counter
	recoveries *prometheus.CounterVec
}

// Frozen-window buckets: 10 ms to about 20 s.
var downtimeBuckets = prometheus.ExponentialBuckets(0.01, 2, 12)

// Whole migrations and phases: 10 ms to about 5 min.
var durationBuckets = prometheus.ExponentialBuckets(0.01, 2.5, 12)

// New registers the metrics, the gauges g reads, and the Go and process
// collectors in a registry of their own.
func New(g Gauges) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "migrations_started_total",
			Help: "Migrations this node took part in, by role (source or destination)."}, []string{"role"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "migrations_total",
			Help: "Ended migrations by role, strategy and outcome (ok, aborted, rolled-back, lost, undecided)."},
			[]string{"role", "strategy", "outcome"}),
		downtime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "migration_downtime_seconds",
			Help:    "Frozen window of successful migrations from this node: from the freeze to the service answering on the destination.",
			Buckets: downtimeBuckets}, []string{"strategy"}),
		total: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "migration_duration_seconds",
			Help: "Whole duration of migrations from this node, by strategy and outcome.", Buckets: durationBuckets},
			[]string{"strategy", "outcome"}),
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "migration_phase_seconds",
			Help:    "Duration of each phase (prepare, precopy, dump, transfer, restore, network, lazy, cleanup) of migrations from this node.",
			Buckets: durationBuckets}, []string{"strategy", "phase"}),
		wire: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "migration_wire_bytes_total",
			Help: "Bytes sent on the wire by migrations from this node (after compression)."}, []string{"strategy"}),
		state: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "migration_state_bytes_total",
			Help: "State moved by migrations from this node: checkpoint images and writable layer, before compression."}, []string{"strategy"}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "migration_held_packets_total",
			Help: "Client packets held during frozen windows and delivered to the restored service."}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "recoveries_total",
			Help: "Migrations settled by an agent that restarted in the middle of them, by outcome (also adopted: a committed copy whose record said incoming; quarantined: an unreadable journal record, its data kept)."}, []string{"outcome"}),
	}
	m.reg.MustRegister(m.started, m.ended, m.downtime, m.total, m.phase, m.wire, m.state, m.held, m.recoveries,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if g.Containers != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "containers",
			Help: "Containers on this node."}, func() float64 { return float64(g.Containers()) }))
	}
	if g.Running != nil {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "migrations_running",
			Help: "Migrations this node is taking part in now."}, func() float64 { return float64(g.Running()) }))
	}
	return m
}

// MigrationStarted counts a migration this node takes part in as role.
func (m *Metrics) MigrationStarted(role migration.Role) {
	m.started.WithLabelValues(string(role)).Inc()
}

// ObserveResult records an ended migration as seen by role. Durations
// and sizes are recorded from the source's result only.
func (m *Metrics) ObserveResult(r migration.Result, role migration.Role) {
	strategy := string(r.Strategy)
	outcome := string(r.Outcome)
	if outcome == "" {
		outcome = string(migration.OutcomeOK)
		if !r.OK {
			outcome = "failed"
		}
	}
	m.ended.WithLabelValues(string(role), strategy, outcome).Inc()
	if role != migration.RoleSource {
		return
	}
	m.total.WithLabelValues(strategy, outcome).Observe(r.TotalMs / 1000)
	for name, ms := range r.PhasesMs {
		m.phase.WithLabelValues(strategy, name).Observe(ms / 1000)
	}
	m.wire.WithLabelValues(strategy).Add(float64(max(r.BytesOnWire, 0)))
	m.state.WithLabelValues(strategy).Add(float64(max(r.StateBytes, 0)))
	if r.OK {
		m.downtime.WithLabelValues(strategy).Observe(r.DowntimeMs / 1000)
		m.held.Add(float64(max(r.HeldPackets, 0)))
	}
}

// Recovered counts a migration settled after a restart.
func (m *Metrics) Recovered(outcome string) {
	m.recoveries.WithLabelValues(outcome).Inc()
}

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is the metrics' registry (for tests and embedding).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

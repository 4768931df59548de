package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/edgehop/edgehop/internal/migration"
)

func TestObserveResult(t *testing.T) {
	containers, running := 3, 1
	m := New(Gauges{Containers: func() int { return containers }, Running: func() int { return running }})
	ok := migration.Result{Strategy: "pre-copy", OK: true, Outcome: migration.OutcomeOK, DowntimeMs: 250, TotalMs: 1500,
		PhasesMs: map[string]float64{"dump": 100, "restore": 120}, BytesOnWire: 1000, StateBytes: 4000, HeldPackets: 7}
	m.MigrationStarted(migration.RoleSource)
	m.ObserveResult(ok, migration.RoleSource)
	m.ObserveResult(ok, migration.RoleDestination) // the other side's view: counted, not measured twice
	m.ObserveResult(migration.Result{Strategy: "post-copy", Outcome: migration.OutcomeRolledBack, TotalMs: 900, BytesOnWire: 500,
		DowntimeMs: 800}, migration.RoleSource)
	m.Recovered("rolled-back")

	if got := testutil.ToFloat64(m.ended.WithLabelValues("source", "pre-copy", "ok")); got != 1 {
		t.Errorf("ok source migrations = %v", got)
	}
	if got := testutil.ToFloat64(m.ended.WithLabelValues("destination", "pre-copy", "ok")); got != 1 {
		t.Errorf("ok destination migrations = %v", got)
	}
	if got := testutil.ToFloat64(m.ended.WithLabelValues("source", "post-copy", "rolled-back")); got != 1 {
		t.Errorf("rolled-back migrations = %v", got)
	}
	if got := testutil.ToFloat64(m.wire.WithLabelValues("pre-copy")); got != 1000 {
		t.Errorf("wire bytes = %v, want 1000 (destination's result not added)", got)
	}
	if got := testutil.ToFloat64(m.held); got != 7 {
		t.Errorf("held = %v", got)
	}
	// Only the successful migration's frozen window is a downtime.
	if n := testutil.CollectAndCount(m.downtime); n != 1 {
		t.Errorf("downtime series = %d, want 1", n)
	}
	if n := testutil.CollectAndCount(m.phase); n != 2 {
		t.Errorf("phase series = %d, want 2", n)
	}
	if got := testutil.ToFloat64(m.recoveries.WithLabelValues("rolled-back")); got != 1 {
		t.Errorf("recoveries = %v", got)
	}

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`edgehop_containers 3`, `edgehop_migrations_running 1`,
		`edgehop_migration_downtime_seconds_bucket{strategy="pre-copy",le="0.32"} 1`,
		`edgehop_migration_downtime_seconds_bucket{strategy="pre-copy",le="0.16"} 0`,
		`edgehop_migrations_started_total{role="source"} 1`,
		`go_goroutines`, `process_resident_memory_bytes`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
	problems, err := promlint.New(strings.NewReader(string(body))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, Namespace+"_") {
			t.Errorf("lint %s: %s", p.Metric, p.Text)
		}
	}
}

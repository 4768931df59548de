package controller

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/store"
	"github.com/edgehop/edgehop/internal/topo"
)

// fakeAccess records handoffs (a unit-test seam; the testbed moves real
// links).
type fakeAccess struct {
	mu   sync.Mutex
	hops [][2]string
}

func (f *fakeAccess) Handoff(ctx context.Context, user, from, to string) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hops = append(f.hops, [2]string{from, to})
	return 3 * time.Millisecond, nil
}

func newTestController(t *testing.T, path string) (*Controller, *fakeAccess) {
	t.Helper()
	st, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	acc := &fakeAccess{}
	c, err := New(context.Background(), Config{Topology: topo.Line(3, 2, 300), Radio: radio.DefaultModel(), Store: st, Access: acc})
	if err != nil {
		t.Fatal(err)
	}
	return c, acc
}

// feed reports node RTTs to the user growing 1 ms per 100 m (what the
// agents would measure in the testbed).
func feed(t *testing.T, c *Controller, user string, p topo.Point) {
	t.Helper()
	for _, n := range c.eng.Topology().Nodes {
		rtt := map[string]float64{user: 1 + topo.Dist(n.Pos, p)/100}
		if _, err := c.Heartbeat(context.Background(), api.Heartbeat{Node: n.Name, Address: "172.30.0.2", UserRTTMs: rtt,
			NeighbourRTTMs: map[string]float64{"node0": 4, "node1": 4, "node2": 8}}); err != nil {
			t.Fatal(err)
		}
	}
}

// A user walking across three regions is handed from AP to AP (tier 1),
// and its service's latency policy decides to follow it to node1, then
// node2 (tier 2), every decision logged with its inputs.
func TestWalkAcrossRegions(t *testing.T) {
	c, acc := newTestController(t, ":memory:")
	ctx := context.Background()
	if _, err := c.AddUser(ctx, "alice", "172.31.0.2", topo.Point{X: 20}); err != nil {
		t.Fatal(err)
	}
	feed(t, c, "alice", topo.Point{X: 20})
	if _, err := c.AddService(ctx, ServiceState{Name: "redis", User: "alice", Node: "node0",
		Policy: policy.Config{Kind: policy.KindLatency, ThresholdMs: 3, MinDwell: time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for x := 20.0; x <= 880; x += 20 {
		feed(t, c, "alice", topo.Point{X: x})
		res, err := c.Move(ctx, "alice", topo.Point{X: x})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range res.Decisions {
			if d.Migrate {
				targets = append(targets, d.To)
				// No agents here: mark it done as an agent job would.
				c.eng.Migrated(d.Service, d.To, true, time.Now())
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	c.wg.Wait()
	if strings.Join(targets, ",") != "node1,node2" {
		t.Errorf("migrations to %v, want node1 then node2", targets)
	}
	u, _ := c.eng.User("alice")
	if u.AP != "ap5" || u.Region != "region2" {
		t.Errorf("user ends on %s/%s, want ap5/region2", u.AP, u.Region)
	}
	if len(acc.hops) != 6 { // attach to ap0, then ap1..ap5
		t.Errorf("handoffs %v, want 6", acc.hops)
	}
	ds, err := c.store.History(ctx, KindDecisions, 0, 0)
	if err != nil || len(ds) == 0 {
		t.Fatalf("decisions logged: %d, %v", len(ds), err)
	}
	var d DecisionRecord
	if err := json.Unmarshal(ds[0].Data, &d); err != nil || d.Reason == "" || d.Inputs == (policy.Inputs{}) {
		t.Errorf("a decision without reason or inputs: %s", ds[0].Data)
	}
}

// A restarted controller reads its users and services back from the
// store.
func TestRestartFromStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.db")
	c, _ := newTestController(t, path)
	ctx := context.Background()
	if _, err := c.AddUser(ctx, "alice", "", topo.Point{X: 400}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddService(ctx, ServiceState{Name: "redis", User: "alice", Node: "node1", Policy: policy.Config{Kind: policy.KindRegion}}); err != nil {
		t.Fatal(err)
	}
	c.persist(ctx)
	c.store.Close()
	c2, _ := newTestController(t, path)
	u, ok := c2.eng.User("alice")
	s, ok2 := c2.eng.Service("redis")
	if !ok || !ok2 || u.AP != "ap2" || s.Node != "node1" || s.Policy.Kind != policy.KindRegion {
		t.Fatalf("after restart: user %+v (%t), service %+v (%t)", u, ok, s, ok2)
	}
	if es, _ := c2.store.History(ctx, KindEvents, 0, 0); len(es) == 0 {
		t.Error("history lost across the restart")
	}
}

// A node that stops heartbeating is never chosen.
func TestDeadNodeNotChosen(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	ctx := context.Background()
	if _, err := c.AddUser(ctx, "alice", "", topo.Point{X: 550}); err != nil {
		t.Fatal(err)
	}
	feed(t, c, "alice", topo.Point{X: 550})
	if _, err := c.AddService(ctx, ServiceState{Name: "redis", User: "alice", Node: "node0",
		Policy: policy.Config{Kind: policy.KindLatency, ThresholdMs: 2}}); err != nil {
		t.Fatal(err)
	}
	// node1 (the closest) falls silent: its heartbeat ages out.
	if died := c.eng.Tick(time.Now().Add(10 * time.Second)); len(died) != 3 {
		t.Fatalf("died %v", died)
	}
	for _, n := range []string{"node0", "node2"} {
		if err := c.eng.Heartbeat(n, "", 0, nil, time.Now().Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	ds := c.eng.Decide("alice", time.Now().Add(10*time.Second))
	if len(ds) != 1 || (ds[0].Migrate && ds[0].To == "node1") {
		t.Fatalf("decision %+v", ds)
	}
	if !ds[0].Migrate || ds[0].To != "node2" {
		t.Errorf("want node2, the closest live node: %+v", ds[0])
	}
}

func TestAPIAndOpenAPI(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	srv, tok := serveAPI(t, c)
	post := func(path, body string) *http.Response {
		return do(t, "POST", srv.URL+path, "application/json", body, "Bearer "+tok)
	}
	if r := post("/v1/users", `{"name":"bob","pos":{"x":10,"y":0}}`); r.StatusCode != http.StatusCreated {
		t.Fatalf("add user: %s", r.Status)
	}
	if r := post("/v1/users", `{"name":"../x","pos":{"x":10}}`); r.StatusCode != http.StatusBadRequest {
		t.Errorf("bad user name: %s", r.Status)
	}
	if r := post("/v1/users", `{"name":"y","bogus":1}`); r.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown field: %s", r.Status)
	}
	if r := post("/v1/users/nobody/position", `{"pos":{"x":1}}`); r.StatusCode != http.StatusNotFound {
		t.Errorf("unknown user: %s", r.Status)
	}
	if r := post("/v1/services", `{"name":"s","user":"bob","node":"node9","policy":{"kind":"latency"}}`); r.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown node: %s", r.Status)
	}
	r := post("/v1/users/bob/position", `{"pos":{"x":400,"y":0}}`)
	var mr MoveResult
	if err := json.NewDecoder(r.Body).Decode(&mr); err != nil || mr.Handoff == nil || mr.Handoff.ToAP != "ap2" {
		t.Fatalf("move: %+v %v", mr, err)
	}
	resp := do(t, "GET", srv.URL+"/openapi.json", "", "", "Bearer "+tok)
	var doc map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	paths := doc["paths"].(map[string]any)
	for _, rt := range c.routes() {
		item, ok := paths[rt.path].(map[string]any)
		if !ok || item[strings.ToLower(rt.method)] == nil {
			t.Errorf("route %s %s missing from openapi.json", rt.method, rt.path)
		}
	}
	resp = do(t, "GET", srv.URL+"/v1/handoffs?limit=5", "", "", "Bearer "+tok)
	var es []store.Entry
	if err := json.NewDecoder(resp.Body).Decode(&es); err != nil || len(es) != 2 {
		t.Errorf("handoffs: %d, %v", len(es), err)
	}
}

// A restarted controller makes no decision for a service until an agent
// lists it: the store's node may be stale (a migration may have ended
// while the controller was down), and deciding from it would migrate
// from a node that no longer runs the service.
func TestRestoredServiceWaitsForItsNode(t *testing.T) {
	e, err := NewEngine(topo.Line(3, 2, 300), radio.DefaultModel(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	e.Restore([]UserState{{Name: "alice", Pos: topo.Point{X: 800}}},
		[]ServiceState{{Name: "redis", User: "alice", Node: "node0", Policy: policy.Config{Kind: policy.KindRegion}}})
	for _, n := range []string{"node0", "node1", "node2"} {
		if err := e.Heartbeat(n, "", 0, nil, now); err != nil {
			t.Fatal(err)
		}
	}
	if ds := e.Decide("", now); len(ds) != 0 {
		t.Fatalf("decided %+v for a service no agent has listed since the restart", ds)
	}
	if err := e.Heartbeat("node2", "", 0, []string{"redis"}, now); err != nil {
		t.Fatal(err)
	}
	if s, _ := e.Service("redis"); s.Node != "node2" {
		t.Fatalf("service on %s after node2 listed it", s.Node)
	}
	ds := e.Decide("", now)
	if len(ds) != 1 || ds[0].Migrate {
		t.Fatalf("decisions %+v, want one, staying on node2 (the user's region)", ds)
	}
}

// A service an agent reports in a migration the controller did not start
// (or lost track of when it restarted) gets no decision until an agent
// lists it running again.
func TestBusyServiceWaits(t *testing.T) {
	e, err := NewEngine(topo.Line(3, 2, 300), radio.DefaultModel(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	e.AddUser(UserState{Name: "alice", Pos: topo.Point{X: 800}})
	if err := e.AddService(ServiceState{Name: "redis", User: "alice", Node: "node0", Policy: policy.Config{Kind: policy.KindRegion}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node0", "node1", "node2"} {
		if err := e.Heartbeat(n, "", 0, nil, now); err != nil {
			t.Fatal(err)
		}
	}
	e.Busy([]string{"redis"})
	if ds := e.Decide("", now); len(ds) != 0 {
		t.Fatalf("decided %+v for a service in a migration", ds)
	}
	if err := e.Heartbeat("node1", "", 0, []string{"redis"}, now); err != nil {
		t.Fatal(err)
	}
	ds := e.Decide("", now)
	if s, _ := e.Service("redis"); s.Node != "node1" || len(ds) != 1 || ds[0].From != "node1" {
		t.Fatalf("after node1 listed it: on %s, decisions %+v", s.Node, ds)
	}
}

// oneAgent serves, as every node's agent, the events of migration jobs
// that have ended: a unit-test seam standing in for the agents' operator
// API.
type oneAgent struct{ url string }

func (a oneAgent) Agent(string) (*api.Client, error) {
	return api.NewTCPClient(strings.TrimPrefix(a.url, "http://"), http.DefaultClient), nil
}

// resumeOne runs a controller on st, with every agent served at url,
// until it has recorded one migration (the in-flight one it resumed), and
// returns that record.
func resumeOne(t *testing.T, st store.Store, url string) MigrationRecord {
	t.Helper()
	ctx := context.Background()
	c, err := New(ctx, Config{Topology: topo.Line(3, 2, 300), Radio: radio.DefaultModel(), Store: st, Access: &fakeAccess{}, Agents: oneAgent{url}, Tick: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()
	var got []store.Entry
	for deadline := time.Now().Add(10 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		got, _ = st.History(ctx, KindMigrations, 0, 10)
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	if len(got) != 1 {
		t.Fatalf("history has %d migrations, want the resumed one", len(got))
	}
	var rec MigrationRecord
	if err := json.Unmarshal(got[0].Data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// A controller killed while a migration it started ran follows the job
// to its end after its restart, and records it with the decision's
// policy and reason.
func TestResumeInFlightMigration(t *testing.T) {
	res, _ := json.Marshal(map[string]any{"ok": true, "outcome": "ok", "downtime_ms": 123.0})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/v1/migrations/m1/events") {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(api.JobEvent{Done: &api.Job{ID: "m1", State: "ok", Result: res}})
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "c.db")
	st, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Put(ctx, recInFlight, "m1", MigrationRecord{ID: "m1", Service: "redis", User: "alice", From: "node0", To: "node1",
		Strategy: "stop-and-copy", Policy: "latency", Reason: "above the threshold"}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec := resumeOne(t, st, srv.URL)
	if rec.ID != "m1" || !rec.OK || rec.DowntimeMs != 123 || rec.Reason != "above the threshold" {
		t.Fatalf("recorded %+v", rec)
	}
	n := 0
	_ = st.List(ctx, recInFlight, func(string, json.RawMessage) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d in-flight records left", n)
	}
}

// A group's migration is one record over its members' jobs: a restarted
// controller follows every job, and the record has the longest member's
// downtime, every member's bytes, and moved only if all did.
func TestResumeInFlightGroupMigration(t *testing.T) {
	results := map[string]map[string]any{
		"m1": {"container": "db", "ok": true, "outcome": "ok", "downtime_ms": 80.0, "total_ms": 900.0, "bytes_on_wire": 1000},
		"m2": {"container": "web", "ok": true, "outcome": "ok", "downtime_ms": 120.0, "total_ms": 700.0, "bytes_on_wire": 500, "phases_ms": map[string]float64{"dump": 40}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for id, res := range results {
			if strings.HasSuffix(r.URL.Path, "/v1/migrations/"+id+"/events") {
				b, _ := json.Marshal(res)
				_ = json.NewEncoder(w).Encode(api.JobEvent{Done: &api.Job{ID: id, State: "ok", Result: b}})
				return
			}
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	st, err := store.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if err := st.Put(ctx, recInFlight, "m1", MigrationRecord{ID: "m1", Jobs: []string{"m1", "m2"}, Service: "app", User: "alice", From: "node0", To: "node1",
		Strategy: "stop-and-copy", Policy: "latency"}); err != nil {
		t.Fatal(err)
	}
	rec := resumeOne(t, st, srv.URL)
	if !rec.OK || rec.DowntimeMs != 120 || rec.TotalMs != 900 || rec.Bytes != 1500 || rec.PhasesMs["dump"] != 40 {
		t.Fatalf("recorded %+v", rec)
	}
}

// A service that is a group is placed where its node's agent reports the
// group whole, and is marked a group (it moves as one).
func TestEngineGroups(t *testing.T) {
	e, err := NewEngine(topo.Line(3, 2, 300), radio.DefaultModel(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e.AddUser(UserState{Name: "alice"})
	if err := e.AddService(ServiceState{Name: "app", User: "alice", Node: "node0", Policy: policy.Config{Kind: policy.KindRegion}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Heartbeat("node1", "", 0, []string{"db", "web"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if s, _ := e.Service("app"); s.Group || s.Node != "node0" {
		t.Fatalf("before any agent reported the group: %+v", s)
	}
	e.Groups("node1", []string{"app", "other"}, time.Now())
	if s, _ := e.Service("app"); !s.Group || s.Node != "node1" {
		t.Fatalf("after node1 reported it: %+v", s)
	}
}

// A group whose members run on two nodes (one moved alone) is reported
// whole by each node's agent, which knows only its own members: the
// controller marks it split once both have reported it twice in a row
// (not in the moment after a migration, the source's last report still
// having it), records an event each way, and decides nothing for it
// until one node alone reports it again.
func TestGroupSplitAcrossNodes(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	ctx := context.Background()
	if _, err := c.AddUser(ctx, "alice", "172.31.0.2", topo.Point{X: 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddService(ctx, ServiceState{Name: "app", User: "alice", Node: "node0",
		Policy: policy.Config{Kind: policy.KindRegion}}); err != nil {
		t.Fatal(err)
	}
	beat := func(node string, containers []string, groups ...string) {
		t.Helper()
		if _, err := c.Heartbeat(ctx, api.Heartbeat{Node: node, Containers: containers, Groups: groups}); err != nil {
			t.Fatal(err)
		}
	}
	// decides: its policy ran (not the wait of a split group, Reunite).
	decides := func() bool {
		ds := c.eng.Decide("alice", time.Now())
		return len(ds) > 0 && !strings.HasPrefix(ds[0].Reason, "split across")
	}
	beat("node0", []string{"db", "web"}, "app")
	beat("node1", nil)
	if s, _ := c.eng.Service("app"); s.Split != nil || s.Node != "node0" || !decides() {
		t.Fatalf("whole on node0: %+v", s)
	}
	// Moved whole to node1: node1 reports it before node0 reports it gone.
	beat("node0", []string{"db", "web"}, "app")
	beat("node1", []string{"db", "web"}, "app")
	if s, _ := c.eng.Service("app"); s.Split != nil || s.Node != "node1" {
		t.Fatalf("moved to node1, node0 not yet reporting it gone: %+v", s)
	}
	beat("node0", nil)
	beat("node1", []string{"db", "web"}, "app")
	// web moves back to node0 alone: two nodes hold it, report after report.
	beat("node0", []string{"web"}, "app")
	beat("node1", []string{"db"}, "app")
	if s, _ := c.eng.Service("app"); s.Split != nil {
		t.Fatalf("split after one report of node0: %+v", s)
	}
	beat("node0", []string{"web"}, "app")
	s, _ := c.eng.Service("app")
	if !slices.Equal(s.Split, []string{"node0", "node1"}) || decides() {
		t.Fatalf("split: %+v", s)
	}
	// Its two halves stay split whichever reports last.
	beat("node1", []string{"db"}, "app")
	if s, _ := c.eng.Service("app"); len(s.Split) != 2 {
		t.Fatalf("split, node1 again: %+v", s)
	}
	// db joins web on node0.
	beat("node1", nil)
	if s, _ := c.eng.Service("app"); s.Split != nil || s.Node != "node0" || !decides() {
		t.Fatalf("whole on node0 again: %+v", s)
	}
	// A node that died holds no part.
	beat("node1", []string{"web"}, "app")
	beat("node1", []string{"web"}, "app")
	c.eng.Tick(time.Now().Add(time.Hour))
	beat("node0", []string{"db"}, "app")
	if s, _ := c.eng.Service("app"); s.Split != nil {
		t.Fatalf("node1 dead: %+v", s)
	}
	var kinds []string
	es, err := c.store.History(ctx, KindEvents, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range slices.Backward(es) { // newest first
		var ev Event
		if err := json.Unmarshal(en.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(ev.Type, "group-") {
			kinds = append(kinds, ev.Type)
		}
	}
	if want := []string{"group-split", "group-whole", "group-split", "group-whole"}; !slices.Equal(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
}

// The model predicts a migration from the memory the service's agent
// measures (a group's: its members' sum), not the operator's guess.
func TestModelUsesMeasuredMemory(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	ctx := context.Background()
	if _, err := c.AddUser(ctx, "alice", "172.31.0.2", topo.Point{X: 20}); err != nil {
		t.Fatal(err)
	}
	feed(t, c, "alice", topo.Point{X: 20})
	if _, err := c.AddService(ctx, ServiceState{Name: "app", User: "alice", Node: "node0", MemoryBytes: 1 << 20,
		Policy: policy.Config{Kind: policy.KindModel, DowntimeTargetMs: 1e6, MinDwell: time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	const measured = 300 << 20
	// node1 reports nothing of app (not there); node0 runs it whole.
	if _, err := c.Heartbeat(ctx, api.Heartbeat{Node: "node1", MemoryBytes: map[string]int64{"app": 5 << 30}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Heartbeat(ctx, api.Heartbeat{Node: "node0", Containers: []string{"db", "web"}, Groups: []string{"app"},
		MemoryBytes: map[string]int64{"db": measured - 100<<20, "web": 100 << 20, "app": measured}}); err != nil {
		t.Fatal(err)
	}
	if s, _ := c.eng.Service("app"); s.MeasuredBytes != measured || !s.Group {
		t.Fatalf("service after node0's heartbeat: %+v", s)
	}
	var moved *policy.Decision
	for x := 20.0; x <= 880 && moved == nil; x += 40 {
		feed(t, c, "alice", topo.Point{X: x})
		res, err := c.Move(ctx, "alice", topo.Point{X: x})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range res.Decisions {
			if d.Migrate {
				moved = &d
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	c.wg.Wait()
	if moved == nil {
		t.Fatal("the model never moved the service")
	}
	if moved.Inputs.StateBytes != measured || moved.Inputs.PredictedTotalMs <= 0 {
		t.Errorf("decision predicted from %v bytes (total %.0f ms), want the measured %d", moved.Inputs.StateBytes, moved.Inputs.PredictedTotalMs, measured)
	}
}

// A group split across two nodes for its policy's ReuniteAfter is made
// whole on the one nearer its user: the members on the other move there
// as one. Until then, and while that migration runs, it stays split; a
// reunite that fails waits ReuniteAfter again.
func TestSplitGroupReunited(t *testing.T) {
	c, _ := newTestController(t, ":memory:")
	ctx := context.Background()
	if _, err := c.AddUser(ctx, "alice", "172.31.0.2", topo.Point{X: 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddService(ctx, ServiceState{Name: "app", User: "alice", Node: "node0",
		Policy: policy.Config{Kind: policy.KindLatency, Strategy: "pre-copy", ReuniteAfter: 20 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	beat := func(node string, containers []string, groups ...string) {
		t.Helper()
		if err := c.eng.Heartbeat(node, "", 0, containers, t0); err != nil {
			t.Fatal(err)
		}
		c.eng.Groups(node, groups, t0)
	}
	if err := c.eng.Measurements("node0", nil, map[string]float64{"alice": 9}); err != nil {
		t.Fatal(err)
	}
	if err := c.eng.Measurements("node1", nil, map[string]float64{"alice": 4}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		beat("node0", []string{"web"}, "app")
		beat("node1", []string{"db"}, "app")
	}
	if s, _ := c.eng.Service("app"); !slices.Equal(s.Split, []string{"node0", "node1"}) || !s.SplitSince.Equal(t0) {
		t.Fatalf("split: %+v", s)
	}
	decide := func(at time.Duration) policy.Decision {
		t.Helper()
		ds := c.eng.Decide("alice", t0.Add(at))
		if len(ds) != 1 {
			t.Fatalf("at %s: decisions %+v", at, ds)
		}
		return ds[0]
	}
	if d := decide(19 * time.Second); d.Migrate || !strings.Contains(d.Reason, "made whole once split for 20s") {
		t.Fatalf("before ReuniteAfter: %+v", d)
	}
	d := decide(21 * time.Second)
	if !d.Migrate || d.From != "node0" || d.To != "node1" || d.Strategy != "pre-copy" || !strings.Contains(d.Reason, "reunite") {
		t.Fatalf("after ReuniteAfter: %+v, want pre-copy of node0's members to node1 (nearer alice)", d)
	}
	// Migrating: no other decision, and the heartbeats keep it split.
	if ds := c.eng.Decide("alice", t0.Add(22*time.Second)); len(ds) != 0 {
		t.Fatalf("while pending: %+v", ds)
	}
	beat("node0", []string{"web"}, "app")
	beat("node1", []string{"db"}, "app")
	if s, _ := c.eng.Service("app"); len(s.Split) != 2 {
		t.Fatalf("while reuniting: %+v", s)
	}
	// It failed: split again, and it waits ReuniteAfter anew.
	c.eng.Migrated("app", "", false, t0.Add(30*time.Second))
	if d := decide(40 * time.Second); d.Migrate {
		t.Fatalf("10 s after a failed reunite: %+v", d)
	}
	if d := decide(51 * time.Second); !d.Migrate || d.To != "node1" {
		t.Fatalf("21 s after a failed reunite: %+v", d)
	}
	// It worked: node0 reports nothing, node1 the whole group.
	c.eng.Migrated("app", "node1", true, t0.Add(52*time.Second))
	// node0's last report, from before the migration ended, still has it:
	// no second reunite, and node0 no longer holds it steadily.
	if d := decide(53 * time.Second); d.Migrate {
		t.Fatalf("right after the reunite: %+v", d)
	}
	beat("node1", []string{"db", "web"}, "app")
	if s, _ := c.eng.Service("app"); s.Split != nil || s.Node != "node1" {
		t.Fatalf("node1's first report after the reunite: %+v", s)
	}
	beat("node0", []string{"web"}, "app")
	if s, _ := c.eng.Service("app"); s.Split != nil {
		t.Fatalf("node0's one stale report after the reunite split it: %+v", s)
	}
	beat("node0", nil)
	beat("node1", []string{"db", "web"}, "app")
	if s, _ := c.eng.Service("app"); s.Split != nil || !s.SplitSince.IsZero() || s.Node != "node1" || s.Left != "node0" {
		t.Fatalf("whole on node1: %+v", s)
	}
}

// A path's rate is the slower of its two nodes' links, as their
// heartbeats report them; unknown links count for nothing.
func TestEnginePathBps(t *testing.T) {
	e, err := NewEngine(topo.Line(3, 2, 300), radio.DefaultModel(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for n, bps := range map[string]float64{"node0": 1e9, "node1": 100e6, "node2": 0} {
		if err := e.Heartbeat(n, "", bps, nil, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		from, to string
		want     float64
	}{{"node0", "node1", 100e6}, {"node1", "node0", 100e6}, {"node0", "node2", 1e9}, {"node2", "node2", 0}, {"node0", "nowhere", 1e9}} {
		if got := e.PathBps(tc.from, tc.to); got != tc.want {
			t.Errorf("PathBps(%s, %s) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/radio"
	"github.com/edgehop/edgehop/internal/store"
	"github.com/edgehop/edgehop/internal/topo"
)

// Access is the tier-1 seam: it moves a user's virtual access point from
// one physical AP to another and says how long the link was down.
type Access interface {
	Handoff(ctx context.Context, user, from, to string) (time.Duration, error)
}

// Agents reaches a node's operator API (migration jobs).
type Agents interface {
	Agent(node string) (*api.Client, error)
}

// Config configures a Controller.
type Config struct {
	Topology         topo.Topology
	Radio            radio.Model
	Store            store.Store
	Agents           Agents
	Access           Access // nil: handoffs are decided and recorded, not applied
	HeartbeatTimeout time.Duration
	Tick             time.Duration // how often every service is decided again
	Log              *slog.Logger
}

// Controller makes services follow their users: it holds the engine's
// state in its store, applies tier-1 handoffs through Access and starts
// the agents' migration jobs for tier-2 decisions. Safe for concurrent
// use.
type Controller struct {
	cfg    Config
	eng    *Engine
	log    *slog.Logger
	store  store.Store
	events *broadcaster

	mu          sync.Mutex // guards lastReason
	lastReason  map[string]string
	wg          sync.WaitGroup
	runCtx      context.Context
	handoffBusy sync.Map // user -> struct{}: a handoff under way
}

// History kinds in the store.
const (
	KindEvents     = "events"
	KindDecisions  = "decisions"
	KindHandoffs   = "handoffs"
	KindMigrations = "migrations"
)

// Record kinds in the store.
const (
	recTopology = "topology"
	recUser     = "user"
	recService  = "service"
	// recInFlight: a migration job started and not yet recorded as
	// ended, so that a controller that restarts follows it to its end.
	recInFlight = "in-flight"
	recNode     = "node"
)

// New builds a controller; state saved by an earlier run in cfg.Store is
// read back.
func New(ctx context.Context, cfg Config) (*Controller, error) {
	if cfg.Store == nil {
		return nil, errors.New("controller: no store")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	// A saved topology wins over the configured one only when none is
	// configured.
	if len(cfg.Topology.Nodes) == 0 {
		var t topo.Topology
		if err := cfg.Store.Get(ctx, recTopology, "current", &t); err == nil {
			cfg.Topology = t
		}
	}
	eng, err := NewEngine(cfg.Topology, cfg.Radio, cfg.HeartbeatTimeout)
	if err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, eng: eng, log: log, store: cfg.Store, events: newBroadcaster(), lastReason: map[string]string{}, runCtx: ctx}
	if err := cfg.Store.Put(ctx, recTopology, "current", cfg.Topology); err != nil {
		return nil, err
	}
	var users []UserState
	var services []ServiceState
	if err := cfg.Store.List(ctx, recUser, func(_ string, raw json.RawMessage) error {
		var u UserState
		if err := json.Unmarshal(raw, &u); err != nil {
			return err
		}
		users = append(users, u)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read users: %w", err)
	}
	if err := cfg.Store.List(ctx, recService, func(_ string, raw json.RawMessage) error {
		var s ServiceState
		if err := json.Unmarshal(raw, &s); err != nil {
			return err
		}
		services = append(services, s)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read services: %w", err)
	}
	eng.Restore(users, services)
	if len(users)+len(services) > 0 {
		c.event("restored", fmt.Sprintf("state read back from the store: %d users, %d services", len(users), len(services)), nil)
	}
	return c, nil
}

// Engine exposes the decision engine (read-mostly: the API's views).
func (c *Controller) Engine() *Engine { return c.eng }

// Run drives the periodic work until ctx ends: dead-node detection,
// deciding every service again, persisting the state.
func (c *Controller) Run(ctx context.Context) error {
	c.runCtx = ctx
	c.resumeInFlight(ctx)
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.wg.Wait()
			return nil
		case now := <-t.C:
			for _, n := range c.eng.Tick(now) {
				c.event("node-dead", fmt.Sprintf("%s stopped heartbeating: never a migration target until it is back", n), map[string]any{"node": n})
			}
			c.act(c.eng.Decide("", now), now)
			c.persist(ctx)
		}
	}
}

// persist writes the users and services.
func (c *Controller) persist(ctx context.Context) {
	nodes, users, services := c.eng.Snapshot()
	for _, u := range users {
		if err := c.store.Put(ctx, recUser, u.Name, u); err != nil {
			c.log.Warn("persist user", "err", err)
			return
		}
	}
	for _, s := range services {
		if err := c.store.Put(ctx, recService, s.Name, s); err != nil {
			c.log.Warn("persist service", "err", err)
			return
		}
	}
	for _, n := range nodes {
		_ = c.store.Put(ctx, recNode, n.Name, n)
	}
}

// Event is one history entry of kind "events".
type Event struct {
	Time    time.Time      `json:"time"`
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Data    map[string]any `json:"data,omitempty"`
}

func (c *Controller) event(typ, msg string, data map[string]any) {
	e := Event{Time: time.Now().UTC(), Type: typ, Message: msg, Data: data}
	if _, err := c.store.Append(context.WithoutCancel(c.runCtx), KindEvents, e.Time, e); err != nil {
		c.log.Warn("record event", "err", err)
	}
	c.events.publish(KindEvents, e)
	c.log.Info(msg, "event", typ)
}

// AddUser registers a user with its device address and position, and
// attaches it (tier 1) to the strongest access point.
func (c *Controller) AddUser(ctx context.Context, name, address string, pos topo.Point) (UserState, error) {
	if !nameOK(name) {
		return UserState{}, fmt.Errorf("%w: user name %q: letters, digits, '_', '.', '-' (max 63)", ErrInvalid, name)
	}
	c.eng.AddUser(UserState{Name: name, Address: address, Pos: pos, Updated: time.Now().UTC()})
	if _, err := c.Move(ctx, name, pos); err != nil {
		return UserState{}, err
	}
	c.event("user-added", fmt.Sprintf("user %s added at (%.0f, %.0f)", name, pos.X, pos.Y), map[string]any{"user": name})
	u, _ := c.eng.User(name)
	return u, c.store.Put(ctx, recUser, name, u)
}

// AddService registers a service following user, currently on node.
func (c *Controller) AddService(ctx context.Context, s ServiceState) (ServiceState, error) {
	if !nameOK(s.Name) {
		return ServiceState{}, fmt.Errorf("%w: service name %q", ErrInvalid, s.Name)
	}
	if s.Policy.Kind == "" {
		s.Policy.Kind = policy.KindLatency
	}
	s.Policy = s.Policy.WithDefaults()
	if err := c.eng.AddService(s); err != nil {
		return ServiceState{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	c.event("service-added", fmt.Sprintf("service %s on %s follows %s under the %s policy", s.Name, s.Node, s.User, s.Policy.Kind), map[string]any{"service": s.Name})
	got, _ := c.eng.Service(s.Name)
	return got, c.store.Put(ctx, recService, s.Name, got)
}

// Handoff is one tier-1 handoff, as recorded.
type Handoff struct {
	Time           time.Time `json:"time"`
	User           string    `json:"user"`
	FromAP         string    `json:"from_ap"`
	ToAP           string    `json:"to_ap"`
	RSSI           float64   `json:"rssi_dbm"`
	ToRSSI         float64   `json:"to_rssi_dbm"`
	InterruptionMs float64   `json:"interruption_ms"`
	Reason         string    `json:"reason"`
	Error          string    `json:"error,omitempty"`
}

// MoveResult is what a position update caused.
type MoveResult struct {
	User      UserState         `json:"user"`
	Handoff   *Handoff          `json:"handoff,omitempty"`
	Decisions []policy.Decision `json:"decisions"`
}

// Move records a user's position: tier 1 (a handoff if the signal model
// says so, applied through Access), then tier 2 (the user's services'
// policies).
func (c *Controller) Move(ctx context.Context, user string, p topo.Point) (MoveResult, error) {
	now := time.Now()
	d, err := c.eng.Move(user, p, now)
	if err != nil {
		return MoveResult{}, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	var res MoveResult
	if d.Handoff {
		if _, busy := c.handoffBusy.LoadOrStore(user, struct{}{}); !busy {
			h := c.handoff(ctx, user, d)
			c.handoffBusy.Delete(user)
			res.Handoff = &h
		}
	}
	res.Decisions = c.eng.Decide(user, now)
	c.act(res.Decisions, now)
	res.User, _ = c.eng.User(user)
	return res, nil
}

func (c *Controller) handoff(ctx context.Context, user string, d radio.Decision) Handoff {
	h := Handoff{Time: time.Now().UTC(), User: user, FromAP: d.From, ToAP: d.To, RSSI: d.RSSI, ToRSSI: d.ToRSSI, Reason: d.Reason}
	if math.IsInf(h.RSSI, 0) {
		h.RSSI = 0 // first attachment: no serving AP
	}
	if c.cfg.Access != nil {
		dur, err := c.cfg.Access.Handoff(ctx, user, d.From, d.To)
		h.InterruptionMs = float64(dur.Microseconds()) / 1000
		if err != nil {
			h.Error = err.Error()
			c.log.Warn("handoff failed", "user", user, "to", d.To, "err", err)
			c.record(KindHandoffs, h)
			return h
		}
	}
	if err := c.eng.Attach(user, d.To); err != nil {
		h.Error = err.Error()
	}
	c.record(KindHandoffs, h)
	return h
}

// record appends v to the history of kind and publishes it.
func (c *Controller) record(kind string, v any) {
	if _, err := c.store.Append(context.WithoutCancel(c.runCtx), kind, time.Now(), v); err != nil {
		c.log.Warn("record history", "kind", kind, "err", err)
	}
	c.events.publish(kind, v)
}

// Report records a user's device report and decides its services again.
func (c *Controller) Report(ctx context.Context, user string, throughputOps, latencyMs float64) ([]policy.Decision, error) {
	now := time.Now()
	if err := c.eng.Report(user, throughputOps, latencyMs, now); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	ds := c.eng.Decide(user, now)
	c.act(ds, now)
	return ds, nil
}

// DecisionRecord is a decision as the history keeps it.
type DecisionRecord struct {
	Time time.Time `json:"time"`
	policy.Decision
}

// act records decisions (each migration, and each change of a service's
// reason) and starts the migrations.
func (c *Controller) act(ds []policy.Decision, now time.Time) {
	for _, d := range ds {
		c.mu.Lock()
		key := d.Service
		changed := c.lastReason[key] != reasonKind(d)
		c.lastReason[key] = reasonKind(d)
		c.mu.Unlock()
		if d.Migrate || changed {
			c.record(KindDecisions, DecisionRecord{Time: now.UTC(), Decision: d})
		}
		if d.Migrate {
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				c.migrate(d)
			}()
		}
	}
}

// reasonKind is a decision's reason without its numbers, so a service
// whose reason is the same but for a measurement is not logged again.
func reasonKind(d policy.Decision) string {
	b := make([]byte, 0, len(d.Reason))
	for i := 0; i < len(d.Reason); i++ {
		ch := d.Reason[i]
		if (ch >= '0' && ch <= '9') || ch == '.' {
			continue
		}
		b = append(b, ch)
	}
	return fmt.Sprintf("%t %s", d.Migrate, b)
}

// MigrationRecord is a migration the controller started, as recorded.
type MigrationRecord struct {
	ID         string             `json:"id"`
	Time       time.Time          `json:"time"`
	Service    string             `json:"service"`
	User       string             `json:"user"`
	From       string             `json:"from"`
	To         string             `json:"to"`
	Strategy   string             `json:"strategy"`
	Policy     string             `json:"policy"`
	Reason     string             `json:"reason"`
	OK         bool               `json:"ok"`
	Outcome    string             `json:"outcome"`
	DowntimeMs float64            `json:"downtime_ms"`
	TotalMs    float64            `json:"total_ms"`
	PhasesMs   map[string]float64 `json:"phases_ms,omitempty"`
	Bytes      int64              `json:"bytes_on_wire"`
	Error      string             `json:"error,omitempty"`
	// Jobs are a group's member jobs (ID is the first); empty for one
	// container's migration.
	Jobs []string `json:"jobs,omitempty"`
}

// migrate carries a migration decision out as a job of the source's
// agent and records the result.
func (c *Controller) migrate(d policy.Decision) {
	ctx := context.WithoutCancel(c.runCtx)
	rec := MigrationRecord{Time: time.Now().UTC(), Service: d.Service, User: d.User, From: d.From, To: d.To, Strategy: d.Strategy, Policy: d.Policy, Reason: d.Reason}
	fail := func(err error) {
		rec.Error, rec.Outcome = err.Error(), "not-started"
		c.eng.Migrated(d.Service, "", false, time.Now())
		c.record(KindMigrations, rec)
	}
	if c.cfg.Agents == nil {
		fail(errors.New("no agents configured"))
		return
	}
	cl, err := c.cfg.Agents.Agent(d.From)
	if err != nil {
		fail(err)
		return
	}
	s, _ := c.eng.Service(d.Service)
	// The agent budgets the frozen window and chooses compression for
	// the link: without the rate it takes 1 Gbit/s whatever the link.
	bps := d.Inputs.BandwidthBps
	if bps <= 0 {
		bps = c.eng.PathBps(d.From, d.To)
	}
	req := api.MigrateRequest{To: d.To, Strategy: d.Strategy, LinkBps: int64(bps)}
	var jobs []api.Job
	if s.Group {
		// Its members move as one unit, each in a job of its own.
		jobs, err = cl.StartGroupMigration(ctx, d.Service, req)
		if err == nil && len(jobs) == 0 {
			err = fmt.Errorf("group %s has no member on %s", d.Service, d.From)
		}
	} else {
		var j api.Job
		j, err = cl.StartMigration(ctx, d.Service, req)
		jobs = []api.Job{j}
	}
	if err != nil {
		fail(err)
		return
	}
	rec.ID = jobs[0].ID
	if s.Group {
		for _, j := range jobs {
			rec.Jobs = append(rec.Jobs, j.ID)
		}
	}
	c.eng.Started(d.Service, rec.ID)
	if err := c.store.Put(ctx, recInFlight, rec.ID, rec); err != nil {
		c.log.Warn("persist in-flight migration", "id", rec.ID, "err", err)
	}
	c.events.publish("migration-started", rec)
	c.follow(ctx, cl, rec, s.Node)
}

// follow waits for the migration job rec.ID (a group's: every job of
// rec.Jobs) on its source's agent cl to end, records its result and
// where the service is (from when it did not move), and forgets the
// in-flight record.
func (c *Controller) follow(ctx context.Context, cl *api.Client, rec MigrationRecord, from string) {
	fctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	ids := rec.Jobs
	if len(ids) == 0 {
		ids = []string{rec.ID}
	}
	var results []migration.Result
	var err error
	for _, id := range ids {
		var done api.Job
		done, err = cl.FollowJob(fctx, id, func(p api.Progress) {
			c.events.publish("migration-progress", map[string]any{"id": id, "service": rec.Service, "progress": p})
		})
		var r migration.Result
		if err == nil {
			r, err = done.MigrationResult()
		}
		if err != nil {
			break
		}
		results = append(results, r)
	}
	res := migration.UnitResult(results)
	defer func() {
		if err := c.store.Delete(ctx, recInFlight, rec.ID); err != nil {
			c.log.Warn("forget in-flight migration", "id", rec.ID, "err", err)
		}
	}()
	if err != nil {
		rec.Error, rec.Outcome = err.Error(), "unknown"
		// The agents' heartbeats tell where it runs.
		c.eng.Migrated(rec.Service, "", false, time.Now())
		c.record(KindMigrations, rec)
		return
	}
	rec.OK, rec.Outcome, rec.Error = res.OK, string(res.Outcome), res.Error
	rec.DowntimeMs, rec.TotalMs, rec.PhasesMs, rec.Bytes = res.DowntimeMs, res.TotalMs, res.PhasesMs, res.BytesOnWire
	at := from
	if res.OK {
		at = rec.To
	}
	c.eng.Migrated(rec.Service, at, res.OK, time.Now())
	c.record(KindMigrations, rec)
}

// resumeInFlight follows, after a restart, the migrations the controller
// had started and not seen end: their jobs belong to the agents and went
// on without it. Each is recorded when it ends; meanwhile its service is
// busy (no decision for it).
func (c *Controller) resumeInFlight(ctx context.Context) {
	var recs []MigrationRecord
	if err := c.store.List(ctx, recInFlight, func(_ string, raw json.RawMessage) error {
		var r MigrationRecord
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		recs = append(recs, r)
		return nil
	}); err != nil {
		c.log.Warn("read in-flight migrations", "err", err)
		return
	}
	for _, r := range recs {
		if c.cfg.Agents == nil {
			break
		}
		cl, err := c.cfg.Agents.Agent(r.From)
		if err != nil {
			c.log.Warn("resume in-flight migration", "id", r.ID, "err", err)
			continue
		}
		c.eng.Started(r.Service, r.ID)
		c.event("migration-resumed", fmt.Sprintf("following migration %s of %s (%s -> %s), started before the restart", r.ID, r.Service, r.From, r.To), map[string]any{"service": r.Service, "id": r.ID})
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.follow(context.WithoutCancel(ctx), cl, r, r.From)
		}()
	}
}

// Heartbeat records an agent's report and answers with what it should
// measure next.
func (c *Controller) Heartbeat(ctx context.Context, hb api.Heartbeat) (api.HeartbeatReply, error) {
	nodes, _, _ := c.eng.Snapshot()
	wasAlive := false
	for _, n := range nodes {
		if n.Name == hb.Node {
			wasAlive = n.Alive
		}
	}
	if err := c.eng.Heartbeat(hb.Node, hb.Address, hb.LinkBps, hb.Containers, time.Now()); err != nil {
		return api.HeartbeatReply{}, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	for _, s := range c.eng.Groups(hb.Node, hb.Groups, time.Now()) {
		if s.Split != nil {
			c.event("group-split", fmt.Sprintf("%s runs split across %s (a member moved alone): its policy waits until it runs whole on one node; split across two, it is made whole on the one nearer its user after %s ('edgehop migrate %s --to %s' does it now)",
				s.Name, strings.Join(s.Split, ", "), s.Policy.WithDefaults().ReuniteAfter, s.Name, s.Split[0]), map[string]any{"service": s.Name, "nodes": s.Split})
		} else {
			c.event("group-whole", fmt.Sprintf("%s runs whole on %s again", s.Name, s.Node), map[string]any{"service": s.Name, "node": s.Node})
		}
	}
	c.eng.Memory(hb.Node, hb.MemoryBytes)
	c.eng.Busy(hb.Migrating)
	if !wasAlive {
		c.event("node-alive", fmt.Sprintf("%s heartbeats", hb.Node), map[string]any{"node": hb.Node})
	}
	if hb.NeighbourRTTMs != nil || hb.UserRTTMs != nil {
		if err := c.eng.Measurements(hb.Node, hb.NeighbourRTTMs, hb.UserRTTMs); err != nil {
			return api.HeartbeatReply{}, err
		}
	}
	var rep api.HeartbeatReply
	nodes, users, _ := c.eng.Snapshot()
	for _, u := range users {
		if u.Address != "" {
			rep.Users = append(rep.Users, api.Target{Name: u.Name, Address: u.Address})
		}
	}
	for _, n := range nodes {
		if n.Name != hb.Node && n.Address != "" {
			rep.Nodes = append(rep.Nodes, api.Target{Name: n.Name, Address: n.Address})
		}
	}
	return rep, nil
}

// Errors the API maps to status codes.
var (
	ErrInvalid  = errors.New("invalid")
	ErrNotFound = errors.New("not found")
)

func nameOK(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		ok := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || (i > 0 && (ch == '_' || ch == '.' || ch == '-'))
		if !ok {
			return false
		}
	}
	return true
}

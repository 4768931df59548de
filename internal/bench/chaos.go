package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/journal"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

// ChaosConfig turns the soak into a fault soak: migrations whose source or
// destination agent is killed (SIGKILL; the testbed's supervisor starts it
// again) at a random moment, or whose source's or destination's link is cut
// (100 % loss) for a random short time.
type ChaosConfig struct {
	// Probability that a migration gets a fault; 1 gives every migration
	// one, the kinds taking turns (kill the source, kill the destination,
	// cut a link).
	Probability float64
	Seed        int64
	// CaseDir receives the agents' logs and journals of every migration
	// that lost, duplicated or misplaced its service, or did not settle.
	CaseDir string
}

// Validate checks the configuration.
func (c ChaosConfig) Validate() error {
	if c.Probability < 0 || c.Probability > 1 {
		return fmt.Errorf("fault probability %v outside 0..1", c.Probability)
	}
	return nil
}

// FaultKind is what a fault does.
type FaultKind string

// Fault kinds.
const (
	FaultNone       FaultKind = "none"
	KillSource      FaultKind = "kill-source"
	KillDestination FaultKind = "kill-destination"
	CutLink         FaultKind = "cut-link"
)

// Fault is one migration's planned fault. A kill waits for the victim's
// journal to reach Phase (or pass it), or when Phase is empty for At of
// the migration's expected duration; a cut starts likewise (Phase: the
// destination's journal) and lasts CutFor.
type Fault struct {
	Kind    FaultKind       `json:"kind"`
	Phase   migration.Phase `json:"phase,omitempty"`
	At      float64         `json:"at"`                 // 0..1 of the expected duration
	CutNode string          `json:"cut_node,omitempty"` // source or destination
	CutFor  time.Duration   `json:"cut_for,omitempty"`
}

// Cut durations straddle the state stream's TCP_USER_TIMEOUT (15 s): a
// short cut stalls a migration, a long one fails its connections.
const (
	minCut = 300 * time.Millisecond
	maxCut = 18 * time.Second
)

// planFaults is the fault of each migration (strategies[i] is migration
// i's), drawn from seed: the same seed gives the same plan.
func planFaults(seed int64, strategies []migration.Strategy, prob float64) []Fault {
	r := rand.New(rand.NewPCG(uint64(seed), 0x6368616f73))
	kinds := []FaultKind{KillSource, KillDestination, CutLink}
	out := make([]Fault, len(strategies))
	k := 0
	for i, st := range strategies {
		// Every number is drawn whatever is kept, so that one
		// migration's fault does not shift the next one's.
		hit := r.Float64() < prob
		at := r.Float64()
		byPhase := r.IntN(2) == 0
		pi := r.IntN(1 << 16)
		cutDst := r.IntN(2) == 1
		cutFor := minCut + time.Duration(r.Int64N(int64(maxCut-minCut)))
		if !hit {
			out[i] = Fault{Kind: FaultNone}
			continue
		}
		// The soak's three services take turns; (k + k/3) keeps each
		// service from always meeting the same kind.
		f := Fault{Kind: kinds[(k+k/3)%len(kinds)], At: at}
		k++
		switch f.Kind {
		case KillSource, KillDestination:
			if byPhase {
				ps := killPhases(f.Kind, st)
				f.Phase, f.At = ps[pi%len(ps)], 0
			}
		case CutLink:
			f.CutNode, f.CutFor = "source", cutFor.Round(time.Millisecond)
			if cutDst {
				f.CutNode = "destination"
			}
			if byPhase {
				ps := cutPhases(st)
				f.Phase, f.At = ps[pi%len(ps)], 0
			}
		}
		out[i] = f
	}
	return out
}

// killPhases are the phases a victim of kind can be killed in under
// strategy.
func killPhases(kind FaultKind, st migration.Strategy) []migration.Phase {
	live := st == migration.PreCopy || st == migration.Hybrid
	if kind == KillSource {
		ps := []migration.Phase{migration.Preparing}
		if live {
			ps = append(ps, migration.LiveRounds)
		}
		return append(ps, migration.Frozen, migration.Committed)
	}
	return []migration.Phase{migration.Preparing, migration.Prepared, migration.Frozen, migration.Transferred,
		migration.Restored, migration.Committed}
}

// cutPhases are the destination's phases a cut can be aimed at under
// strategy: the transfer, the restore, and with post-copy and hybrid the
// lazy window after the commit (the destination's committed), where a cut
// may lose the service by design.
func cutPhases(st migration.Strategy) []migration.Phase {
	ps := []migration.Phase{migration.Frozen, migration.Transferred, migration.Restored}
	if lazy(st) {
		ps = append(ps, migration.Committed, migration.Committed)
	}
	return ps
}

// phaseRank orders the phases along a migration, so that a kill aimed at a
// phase the victim went through between two looks still happens.
func phaseRank(p migration.Phase) int {
	switch p {
	case migration.Preparing:
		return 0
	case migration.Prepared:
		return 1
	case migration.LiveRounds:
		return 2
	case migration.Frozen:
		return 3
	case migration.Transferred:
		return 4
	case migration.Restored:
		return 5
	case migration.Committed:
		return 6
	case "":
		return -1
	}
	return 7 // final
}

// lazy reports whether strategy st leaves pages on the source after the
// commit (post-copy, hybrid).
func lazy(st migration.Strategy) bool { return st == migration.PostCopy || st == migration.Hybrid }

// inLazyWindow reports whether a migration whose sides are in phases src
// and dst is past the commit with its pages still on the source: a lost
// source or link then loses the service by design.
func inLazyWindow(st migration.Strategy, src, dst migration.Phase) bool {
	return lazy(st) && (src == migration.Committed || (dst == migration.Committed && !src.Final()))
}

// Chaos outcomes besides the source's final phases.
const (
	outcomeFailed = "failed" // refused, or not settled in time
)

// ChaosMigration is what happened to one migration.
type ChaosMigration struct {
	Index    int                `json:"index"`
	ID       string             `json:"id,omitempty"`
	Service  string             `json:"service"`
	Strategy migration.Strategy `json:"strategy"`
	From     string             `json:"from"`
	To       string             `json:"to"`
	Fault    Fault              `json:"fault"`
	// KilledIn is the victim's journal phase at the kill ("none": no
	// record yet, "ended": the migration had ended on both sides); for a
	// cut, the destination's phase as it began.
	KilledIn        string          `json:"killed_in,omitempty"`
	CutInLazyWindow bool            `json:"cut_in_lazy_window,omitempty"`
	Source          migration.Phase `json:"source_phase"`
	Destination     migration.Phase `json:"destination_phase"`
	Outcome         string          `json:"outcome"`    // ok, rolled-back, aborted, lost, failed
	Running         []string        `json:"running_on"` // nodes running the service after it settled
	SettleMs        float64         `json:"settle_ms"`  // from the fault (or the start) until settled
	Error           string          `json:"error,omitempty"`
	Case            string          `json:"case,omitempty"` // directory of the logs kept
	// ClientStalled: the service's client made no progress after it
	// settled (soak's recoverTimeout).
	ClientStalled bool `json:"client_stalled,omitempty"`
}

// victim is "source" or "destination" for a kill, "" otherwise.
func (m ChaosMigration) victim() string {
	switch m.Fault.Kind {
	case KillSource:
		return "source"
	case KillDestination:
		return "destination"
	}
	return ""
}

// ChaosReport counts what the faults did. The goal is zero services lost
// (but by design), duplicated or misplaced, and nothing failed.
type ChaosReport struct {
	Seed        int64          `json:"seed"`
	Probability float64        `json:"fault_probability"`
	Kills       int            `json:"kills"`
	KillsBy     map[string]int `json:"kills_by_victim"` // source, destination
	KillsPhase  map[string]int `json:"kills_by_phase"`  // victim/phase
	LinkCuts    int            `json:"link_cuts"`
	// LinkCutsLazy counts cuts in post-copy's and hybrid's window after
	// the commit, before the last page arrived; LostByDesign the
	// services they lost.
	LinkCutsLazy  int            `json:"link_cuts_lazy_window"`
	LinkCutsPhase map[string]int `json:"link_cuts_by_phase"` // cut node/the destination's phase as it began
	Outcomes      map[string]int `json:"outcomes"`
	ServicesLost  int            `json:"services_lost"` // running nowhere, not by design
	LostByDesign  int            `json:"services_lost_by_design"`
	Duplicated    int            `json:"copies_duplicated"` // running on two nodes or more
	// Misplaced counts services running on one node, but not the one the
	// source's outcome names (ok: the destination, else the source).
	Misplaced int `json:"misplaced"`
	// ClientStalled counts services running on one node whose client
	// then made no progress (once until it does again).
	ClientStalled int              `json:"clients_stalled"`
	Settle        Summary          `json:"settle_ms"`
	LongestSettle float64          `json:"longest_settle_ms"`
	PerMigration  []ChaosMigration `json:"per_migration"`
	settles       []float64
}

func newChaosReport(cfg ChaosConfig) *ChaosReport {
	return &ChaosReport{Seed: cfg.Seed, Probability: cfg.Probability, KillsBy: map[string]int{}, KillsPhase: map[string]int{},
		LinkCutsPhase: map[string]int{}, Outcomes: map[string]int{}}
}

// add counts migration m.
func (r *ChaosReport) add(m ChaosMigration) {
	r.PerMigration = append(r.PerMigration, m)
	if v := m.victim(); v != "" && m.KilledIn != "" { // "": not made (the start was refused)
		r.Kills++
		r.KillsBy[v]++
		r.KillsPhase[v+"/"+m.KilledIn]++
	}
	if m.Fault.Kind == CutLink {
		r.LinkCuts++
		r.LinkCutsPhase[m.Fault.CutNode+"/"+m.KilledIn]++
		if m.CutInLazyWindow {
			r.LinkCutsLazy++
		}
	}
	r.Outcomes[m.Outcome]++
	switch {
	case len(m.Running) == 0 && m.Fault.Kind == CutLink && m.CutInLazyWindow:
		r.LostByDesign++
	case len(m.Running) == 0:
		r.ServicesLost++
	case len(m.Running) > 1:
		r.Duplicated++
	case m.Running[0] != m.wantOn():
		r.Misplaced++
	}
	r.settles = append(r.settles, m.SettleMs)
	r.Settle = Summarize(r.settles)
	r.LongestSettle = max(r.LongestSettle, m.SettleMs)
}

// wantOn is where the source's outcome says the service runs.
func (m ChaosMigration) wantOn() string {
	if m.Outcome == string(migration.OutcomeOK) {
		return m.To
	}
	return m.From
}

// bad reports whether m's logs are worth keeping.
func (m ChaosMigration) bad() bool {
	return len(m.Running) != 1 || m.Running[0] != m.wantOn() || m.Outcome == outcomeFailed
}

// Failures is what a chaos run should have had none of.
func (r *ChaosReport) Failures() int {
	return r.ServicesLost + r.Duplicated + r.Misplaced + r.ClientStalled + r.Outcomes[outcomeFailed]
}

// clientChecked notes whether the last migration's service served its
// client after it settled (err nil), and keeps the logs of the first
// migration after which it stopped serving. A service that stays silent
// counts once, and a lost one's silence as its loss.
func (s *soak) clientChecked(service string, err error) {
	if s.chaos == nil || len(s.chaos.rep.PerMigration) == 0 {
		return
	}
	if err == nil {
		delete(s.chaos.stalled, service)
		return
	}
	r := s.chaos.rep
	m := &r.PerMigration[len(r.PerMigration)-1]
	if s.chaos.stalled[service] || len(m.Running) != 1 {
		return
	}
	s.chaos.stalled[service] = true
	m.ClientStalled = true
	r.ClientStalled++
	if m.Case == "" {
		m.Case = s.keepCase(*m)
	}
}

// chaos runs the faults of a soak; owned by the soak's goroutine.
type chaos struct {
	cfg      ChaosConfig
	plan     []Fault
	rep      *ChaosReport
	expected map[migration.Strategy][]float64 // recent OK durations (ms) without a fault that stalls
	stalled  map[string]bool                  // services whose client made no progress since
}

func newChaos(cfg ChaosConfig, strategies []migration.Strategy) *chaos {
	return &chaos{cfg: cfg, plan: planFaults(cfg.Seed, strategies, cfg.Probability), rep: newChaosReport(cfg),
		expected: map[migration.Strategy][]float64{}, stalled: map[string]bool{}}
}

// expectedDuration is how long a migration with strategy st takes here:
// the median of the last ten that a fault did not stall, 600 ms (the
// soak's stop-and-copy here) before any.
func (c *chaos) expectedDuration(st migration.Strategy) time.Duration {
	xs := c.expected[st]
	if len(xs) == 0 {
		return 600 * time.Millisecond
	}
	return time.Duration(Summarize(xs).P50 * float64(time.Millisecond))
}

func (c *chaos) observe(st migration.Strategy, ms float64) {
	xs := append(c.expected[st], ms)
	if len(xs) > 10 {
		xs = xs[1:]
	}
	c.expected[st] = xs
}

// Bounds of a chaos migration.
const (
	chaosSettle  = 3 * time.Minute // both journals final
	chaosPlaced  = time.Minute     // one running copy found
	chaosRestart = time.Minute     // a killed agent answers again
	chaosPoll    = 2 * time.Millisecond
)

// chaosMigrate is soak.migrate with migration i's fault.
func (s *soak) chaosMigrate(ctx context.Context, i int, svc *soakService, strategy migration.Strategy, to string, downtimes map[string][]float64) error {
	c := s.chaos
	f := c.plan[i]
	if svc.missing {
		// An earlier repair failed: try again before moving it.
		if err := s.repair(ctx, svc, ChaosMigration{From: svc.node}); err != nil {
			s.errorf("chaos migration %d: repair %s again: %v", i, svc.name, err)
		}
	}
	m := ChaosMigration{Index: i, Service: svc.name, Strategy: strategy, From: svc.node, To: to, Fault: f}
	src, _ := s.st.Node(svc.node)
	dst, _ := s.st.Node(to)
	start := time.Now()
	j, err := s.agents[svc.node].StartMigration(ctx, svc.name, api.MigrateRequest{To: to, Strategy: string(strategy),
		LinkBps: int64(s.st.PathRate(svc.node, to))})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	faultAt := start
	stalled := false // whether the fault hit the migration before its source ended
	if err != nil {
		m.Outcome, m.Error = outcomeFailed, "start: "+err.Error()
	} else {
		m.ID = j.ID
		phases := func() (migration.Phase, migration.Phase) {
			return journalPhase(src.StateDir, j.ID), journalPhase(dst.StateDir, j.ID)
		}
		expected := c.expectedDuration(strategy)
		switch f.Kind {
		case KillSource, KillDestination:
			victim := src
			if f.Kind == KillDestination {
				victim = dst
			}
			if err := awaitMoment(ctx, f, expected, f.Kind == KillDestination, phases); err != nil {
				return err
			}
			faultAt = time.Now()
			m.KilledIn = killedIn(journalPhase(victim.StateDir, j.ID), phases)
			a, _ := phases()
			stalled = !a.Final()
			if err := s.killAgent(ctx, victim); err != nil {
				m.Error = err.Error()
			}
		case CutLink:
			node := src
			if f.CutNode == "destination" {
				node = dst
			}
			if err := awaitMoment(ctx, f, expected, true, phases); err != nil {
				return err
			}
			faultAt = time.Now()
			a, b := phases()
			m.KilledIn = string(b) // the destination's phase at the cut
			stalled = !a.Final()
			in, err := s.cutLink(ctx, node, f.CutFor, func() bool {
				a, b := phases()
				return inLazyWindow(strategy, a, b)
			})
			m.CutInLazyWindow = in
			if err != nil {
				m.Error = err.Error()
			}
		}
		m.Source, m.Destination, err = settle(ctx, phases)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case err != nil:
			m.Outcome, m.Error = outcomeFailed, strings.TrimPrefix(m.Error+"; "+err.Error(), "; ")
		default:
			m.Outcome = string(m.Source.Outcome())
		}
		if m.Outcome == string(migration.OutcomeOK) {
			if res, ok := s.jobResult(ctx, svc.node, j.ID); ok {
				downtimes[string(strategy)] = append(downtimes[string(strategy)], res.DowntimeMs)
				if !stalled {
					c.observe(strategy, res.TotalMs)
				}
			}
		}
	}
	m.Running = s.placement(ctx, svc.name)
	m.SettleMs = ms(time.Since(faultAt))
	s.rep.Migrations++
	switch m.Outcome {
	case string(migration.OutcomeOK):
		s.rep.OK++
	case string(migration.OutcomeRolledBack):
		s.rep.RolledBack++
	case string(migration.OutcomeAborted):
	default:
		s.rep.Failed++
	}
	if m.bad() {
		m.Case = s.keepCase(m)
		s.errorf("chaos migration %d of %s (%s, %s in %s) %s -> %s: outcome %s, source %s, destination %s, running on %v; logs in %s",
			i, svc.name, strategy, f.Kind, m.KilledIn, m.From, m.To, m.Outcome, m.Source, m.Destination, m.Running, m.Case)
	}
	if err := s.repair(ctx, svc, m); err != nil {
		s.errorf("chaos migration %d: repair %s: %v", i, svc.name, err)
	}
	c.rep.add(m)
	s.log.Info("chaos migration", "i", i, "service", svc.name, "strategy", strategy, "fault", f.Kind, "killed_in", m.KilledIn,
		"lazy_window", m.CutInLazyWindow, "outcome", m.Outcome, "running", m.Running, "settle_ms", int(m.SettleMs))
	return nil
}

// killedIn names the victim's phase at a kill.
func killedIn(p migration.Phase, phases func() (migration.Phase, migration.Phase)) string {
	if p == "" {
		return "none"
	}
	if a, b := phases(); a.Final() && (b == "" || b.Final()) {
		return "ended"
	}
	return string(p)
}

// awaitMoment returns when fault f is due: the source's journal (dest:
// the destination's) at f.Phase or past it (or the migration ended), or
// after f.At of the expected duration.
func awaitMoment(ctx context.Context, f Fault, expected time.Duration, dest bool, phases func() (migration.Phase, migration.Phase)) error {
	if f.Phase == "" {
		return sleep(ctx, time.Duration(f.At*float64(expected)))
	}
	deadline := time.Now().Add(chaosSettle)
	want := phaseRank(f.Phase)
	for time.Now().Before(deadline) {
		a, b := phases()
		p := a
		if dest {
			p = b
		}
		if phaseRank(p) >= want || (a.Final() && (b == "" || b.Final())) {
			return nil
		}
		if err := sleep(ctx, chaosPoll); err != nil {
			return err
		}
	}
	return nil
}

// agentPID reads node's agent pid file.
func agentPID(m testbed.Member) int {
	b, err := os.ReadFile(filepath.Join(m.StateDir, "agent.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// killAgent kills m's agent with SIGKILL and waits until the testbed's
// supervisor started it again and it answers.
func (s *soak) killAgent(ctx context.Context, m testbed.Member) error {
	old := agentPID(m)
	if old <= 0 {
		return fmt.Errorf("no agent pid for %s", m.Name)
	}
	if err := linux.Kill(old); err != nil {
		return fmt.Errorf("kill agent %s: %w", m.Name, err)
	}
	deadline := time.Now().Add(chaosRestart)
	for {
		if pid := agentPID(m); pid > 0 && pid != old {
			ictx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := s.agents[m.Name].Info(ictx)
			cancel()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent of %s did not come back within %v of a kill (pid was %d)", m.Name, chaosRestart, old)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// cutLink sets m's link to 100 % loss for d, then restores it, and reports
// whether window held at any look during the cut.
func (s *soak) cutLink(ctx context.Context, m testbed.Member, d time.Duration, window func() bool) (in bool, err error) {
	link := m.Link
	cut := link
	cut.Loss = 1
	if err := testbed.SetLink(ctx, s.cfg.Root, s.st.Name, m.Name, cut); err != nil {
		return false, fmt.Errorf("cut %s's link: %w", m.Name, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := testbed.SetLink(rctx, s.cfg.Root, s.st.Name, m.Name, link); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restore %s's link: %w", m.Name, rerr))
		}
	}()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		in = in || window()
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return in, err
		}
	}
	return in || window(), nil
}

// settle waits until both sides' journals are final (a destination
// without a record has nothing to do).
func settle(ctx context.Context, phases func() (migration.Phase, migration.Phase)) (src, dst migration.Phase, err error) {
	deadline := time.Now().Add(chaosSettle)
	for {
		src, dst = phases()
		if src.Final() && (dst == "" || dst.Final()) {
			return src, dst, nil
		}
		if time.Now().After(deadline) {
			return src, dst, fmt.Errorf("not settled within %v: source %q, destination %q", chaosSettle, src, dst)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return src, dst, err
		}
	}
}

// journalPhase is what the journal in a node's state directory says about
// migration id ("" before it has a record).
func journalPhase(stateDir, id string) migration.Phase {
	return journal.PhaseIn(filepath.Join(stateDir, "journal"), id)
}

// jobResult is the source's result of migration id, when its agent still
// knows the job.
func (s *soak) jobResult(ctx context.Context, node, id string) (migration.Result, bool) {
	jctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	j, err := s.agents[node].Job(jctx, id)
	if err != nil || len(j.Result) == 0 {
		return migration.Result{}, false
	}
	res, err := j.MigrationResult()
	return res, err == nil
}

// placement lists the nodes running service name, asking every agent,
// until exactly one runs it and none holds it in another state (or
// chaosPlaced passes).
func (s *soak) placement(ctx context.Context, name string) []string {
	deadline := time.Now().Add(chaosPlaced)
	for {
		var running []string
		settled := true
		for _, n := range s.st.Nodes {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			cs, err := s.agents[n.Name].List(lctx)
			cancel()
			if err != nil {
				settled = false
				continue
			}
			for _, c := range cs {
				if c.Name != name {
					continue
				}
				if c.Status == "running" {
					running = append(running, n.Name)
				} else {
					settled = false
				}
			}
		}
		if (settled && len(running) == 1) || time.Now().After(deadline) || ctx.Err() != nil {
			return running
		}
		_ = sleep(ctx, 100*time.Millisecond)
	}
}

// repair leaves svc running on one node, so the soak goes on: a
// duplicate is removed (the copy the source's outcome names stays), a
// lost service started again at its address on its source (its data
// gone: its client counts the writes lost).
func (s *soak) repair(ctx context.Context, svc *soakService, m ChaosMigration) error {
	switch len(m.Running) {
	case 1:
		svc.node = m.Running[0]
		return nil
	case 0:
		svc.missing = true
		var errs []error
		for _, n := range s.st.Nodes {
			if err := s.agents[n.Name].Remove(ctx, svc.name); err != nil && !errors.Is(err, api.ErrNotFound) {
				errs = append(errs, fmt.Errorf("remove from %s: %w", n.Name, err))
			}
		}
		req := s.runs[svc.name]
		req.IP = svc.ip
		if _, err := s.agents[m.From].Run(ctx, req); err != nil {
			return errors.Join(append(errs, fmt.Errorf("run again on %s: %w", m.From, err))...)
		}
		svc.node, svc.missing = m.From, false
		port := map[string]string{"probe": probePort, "redis": soakRedisPort, "mc": soakMCPort}[svc.name]
		addr := net.JoinHostPort(svc.ip, port)
		if err := waitListening(ctx, s.dialer, addr, 20*time.Second); err != nil {
			return err
		}
		if svc.name == "mc" {
			// The client's incr needs the counter (its first write
			// made it).
			conn, err := s.dialer.DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write([]byte("add soak:ctr 0 0 1\r\n0\r\n"))
			return err
		}
		return nil
	}
	keep := m.wantOn()
	if !slices.Contains(m.Running, keep) {
		keep = m.Running[0]
	}
	var errs []error
	for _, n := range m.Running {
		if n != keep {
			if err := s.agents[n].Remove(ctx, svc.name); err != nil {
				errs = append(errs, fmt.Errorf("remove the copy on %s: %w", n, err))
			}
		}
	}
	svc.node = keep
	return errors.Join(errs...)
}

// keepCase copies every node's agent log and journal record of m into a
// directory of its own under CaseDir, and returns it.
func (s *soak) keepCase(m ChaosMigration) string {
	if s.chaos.cfg.CaseDir == "" {
		return ""
	}
	dir := filepath.Join(s.chaos.cfg.CaseDir, fmt.Sprintf("%s-%03d-%s-%s-%s-%s", s.st.Name, m.Index, m.Service, m.Strategy, m.Fault.Kind, m.KilledIn))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err.Error()
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	_ = os.WriteFile(filepath.Join(dir, "migration.json"), b, 0o644)
	for _, n := range s.st.Nodes {
		if b, err := os.ReadFile(filepath.Join(n.StateDir, "agent.log")); err == nil {
			_ = os.WriteFile(filepath.Join(dir, n.Name+".agent.log"), b, 0o644)
		}
		if m.ID == "" {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(n.StateDir, "journal", m.ID+".log")); err == nil {
			_ = os.WriteFile(filepath.Join(dir, n.Name+".journal.log"), b, 0o644)
		}
	}
	return dir
}

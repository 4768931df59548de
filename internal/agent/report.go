package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/ping"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/runc"
)

// How often the agent reports to the controller and measures RTTs.
const (
	heartbeatEvery = time.Second
	measureEvery   = time.Second
)

// reporter sends the controller this node's heartbeats and measurements
// and measures what the controller asks: the RTT to the devices of users
// and to the other nodes (Teka's possible neighbour database). Owned by
// the goroutine of reportLoop.
type reporter struct {
	a      *Agent
	hc     *http.Client
	url    string
	pinger *ping.Pinger

	mu      sync.Mutex // guards targets and results
	targets api.HeartbeatReply
	users   map[string]float64
	nodes   map[string]float64
}

// reportLoop reports to the controller until ctx ends. A controller that
// is down or refuses is retried; it never stops the agent.
func (a *Agent) reportLoop(ctx context.Context) {
	tlsCfg, err := pki.ClientConfig(a.cfg.TLSDir, controllerCertName)
	if err != nil {
		a.log.Warn("controller reports disabled: tls", "err", err)
		return
	}
	r := &reporter{a: a, url: a.cfg.Controller + "/v1/agents/heartbeat",
		hc: &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConnsPerHost: 1}}}
	if p, err := ping.Open(); err != nil {
		a.log.Warn("RTT measurements disabled", "err", err)
	} else {
		r.pinger = p
		defer p.Close()
		a.wg.Add(1)
		go func() { defer a.wg.Done(); r.measureLoop(ctx) }()
	}
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	failing := false
	for {
		err := r.beat(ctx)
		switch {
		case err != nil && !failing:
			a.log.Warn("controller unreachable; retrying", "controller", a.cfg.Controller, "err", err)
			failing = true
		case err == nil && failing:
			a.log.Info("controller reachable again", "controller", a.cfg.Controller)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// heartbeatOf is the heartbeat of node: cs are its containers, migrating
// those taking part in a migration job. A container runs here for the
// controller when it runs and does not migrate; a group (or pod) when
// every member here does; the groups of a migrating member migrate. Each
// container and group that runs here reports its resident memory (a
// group's, its members' sum): what its migration would move.
func heartbeatOf(node, address string, cs []api.Container, migrating map[string]bool) api.Heartbeat {
	hb := api.Heartbeat{Node: node, Address: address}
	for name := range migrating {
		hb.Migrating = append(hb.Migrating, name)
	}
	whole := map[string]bool{}  // group -> every member here runs, none migrating
	moving := map[string]bool{} // groups with a member migrating
	mem := map[string]int64{}
	for _, c := range cs {
		running := c.Status == string(runc.StatusRunning) && !migrating[c.Name]
		if running {
			hb.Containers = append(hb.Containers, c.Name)
			mem[c.Name] = c.MemoryBytes
		}
		if c.Group == "" {
			continue
		}
		ok, seen := whole[c.Group]
		whole[c.Group] = running && (ok || !seen)
		mem[groupKey(c.Group)] += c.MemoryBytes
		if migrating[c.Name] {
			moving[c.Group] = true
		}
	}
	for g, ok := range whole {
		if ok {
			hb.Groups = append(hb.Groups, g)
		}
	}
	for g := range moving {
		hb.Migrating = append(hb.Migrating, g)
	}
	for _, name := range hb.Containers {
		if mem[name] > 0 {
			setMemory(&hb, name, mem[name])
		}
	}
	for _, g := range hb.Groups {
		if m := mem[groupKey(g)]; m > 0 {
			// A group named as one of its members is the service of
			// that name (the controller moves it whole).
			setMemory(&hb, g, m)
		}
	}
	sort.Strings(hb.Migrating)
	sort.Strings(hb.Groups)
	return hb
}

func setMemory(hb *api.Heartbeat, name string, b int64) {
	if hb.MemoryBytes == nil {
		hb.MemoryBytes = map[string]int64{}
	}
	hb.MemoryBytes[name] = b
}

// controllerCertName is the name in the controller's certificate.
const controllerCertName = "controller"

func (r *reporter) beat(ctx context.Context) error {
	a := r.a
	migrating := map[string]bool{}
	for _, j := range a.jobs.all() {
		if _, ended, _ := j.snapshot(a.cfg.Node); !ended {
			migrating[j.container] = true
		}
	}
	hb := heartbeatOf(a.cfg.Node, a.cfg.VTEP.String(), a.List(ctx), migrating)
	r.mu.Lock()
	hb.UserRTTMs, hb.NeighbourRTTMs = r.users, r.nodes
	r.users, r.nodes = nil, nil
	r.mu.Unlock()
	b, err := json.Marshal(hb)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("controller answered %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	var rep api.HeartbeatReply
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("controller reply: %w", err)
	}
	r.mu.Lock()
	r.targets = rep
	r.mu.Unlock()
	return nil
}

// measureLoop pings the targets the controller named, every
// measureEvery, keeping the median of three echoes each.
func (r *reporter) measureLoop(ctx context.Context) {
	t := time.NewTicker(measureEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		targets := r.targets
		r.mu.Unlock()
		users := r.measure(ctx, targets.Users)
		nodes := r.measure(ctx, targets.Nodes)
		r.mu.Lock()
		r.users, r.nodes = users, nodes
		r.mu.Unlock()
	}
}

func (r *reporter) measure(ctx context.Context, ts []api.Target) map[string]float64 {
	out := map[string]float64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range ts {
		addr, err := netip.ParseAddr(t.Address)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := r.pinger.Median(ctx, addr, 3, 20*time.Millisecond, 500*time.Millisecond)
			if err != nil {
				return
			}
			mu.Lock()
			out[t.Name] = float64(d.Microseconds()) / 1000
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/image"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
)

// RsyncMethod names ARNAB's own migration method in ARNAB reports:
// repeated full CRIU checkpoints of the running container (podman
// checkpoint --leave-running; no pre-dump on a kernel without soft-dirty)
// shipped with rsync, then a final checkpoint, rsync and restore.
const RsyncMethod = "arnab-rsync"

// arnabIP is the podman DPRGen's overlay address, outside every node's range.
const arnabIP = "10.200.250.12"

// ARNABConfig configures RunARNAB.
type ARNABConfig struct {
	Root, Binary, ImageRoot string
	Quick                   bool
	// Strategies are edgehop's; RsyncMethod may be among them.
	Strategies  []string
	RsyncRounds int // live rounds of the rsync method (ARNAB used 2 or more)
	NodeLink    testbed.Link
	Log         *slog.Logger
	Progress    func(ARNABCase)
}

// DefaultARNABConfig is Fig. 6's setting on the testbed's 1 Gbit/s link.
func DefaultARNABConfig() ARNABConfig {
	return ARNABConfig{ImageRoot: image.DefaultRoot, RsyncRounds: 2,
		Strategies: []string{string(migration.StopAndCopy), string(migration.PostCopy), string(migration.PreCopy), string(migration.Hybrid), RsyncMethod},
		NodeLink:   testbed.Link{RateBps: 1_000_000_000, Delay: time.Millisecond}}
}

// arnabCase is one service of the grid.
type arnabCase struct {
	stateMB  float64
	dirtyPct float64
}

// bigServiceMemory is the memory limit of the benchmarks' large
// services, above the agent's default (2 GiB): DPRGen's 1.2 GB with its
// copy buffers, a Redis of 640 MB forking for its own persistence.
const bigServiceMemory = 4 << 30

// grid: ARNAB Fig. 6 — a ~14 MB service and the 1.2 GB RAM simulation at
// 5, 10 and 20 % dirty; quick keeps the small service and 300 MB at 20 %.
func (c ARNABConfig) grid() []arnabCase {
	if c.Quick {
		return []arnabCase{{14, 20}, {300, 20}}
	}
	return []arnabCase{{14, 20}, {1200, 5}, {1200, 10}, {1200, 20}}
}

// ARNABCase is one migration of the grid.
type ARNABCase struct {
	Strategy    string  `json:"strategy"`
	StateMB     float64 `json:"state_mb"`
	DirtyPct    float64 `json:"dirty_pct"`
	OK          bool    `json:"ok"`
	Error       string  `json:"error,omitempty"`
	DowntimeMs  float64 `json:"downtime_ms"`
	TotalMs     float64 `json:"total_ms"`
	BytesOnWire int64   `json:"bytes_on_wire"`
	// PhasesMs is the migration's time per phase (edgehop's strategies),
	// what the downtime was made of.
	PhasesMs map[string]float64 `json:"phases_ms,omitempty"`
	// Memory is DPRGen's own check of its whole state after the restore.
	Memory string `json:"memory"`
	// Ratios of stop-and-copy's and the rsync method's figures to this
	// case's (above 1: this case is better), same state and dirty share.
	DowntimeVsStopAndCopy *float64 `json:"downtime_vs_stop_and_copy,omitempty"`
	TotalVsStopAndCopy    *float64 `json:"total_vs_stop_and_copy,omitempty"`
	DowntimeVsRsync       *float64 `json:"downtime_vs_rsync,omitempty"`
	TotalVsRsync          *float64 `json:"total_vs_rsync,omitempty"`
}

// ARNABReport is what `edgehop bench arnab` prints.
type ARNABReport struct {
	Testbed  TestbedInfo `json:"testbed"`
	Quick    bool        `json:"quick"`
	Cases    []ARNABCase `json:"cases"`
	Goals    []Goal      `json:"goals"`
	ElapsedS float64     `json:"elapsed_s"`
}

// RunARNAB reproduces ARNAB Fig. 6 on a fresh testbed: every service of
// the grid migrated node0 → node1 once with every strategy, DPRGen
// checking its memory afterwards.
func RunARNAB(ctx context.Context, cfg ARNABConfig) (rep *ARNABReport, err error) {
	log := orDiscard(cfg.Log)
	start := time.Now()
	bc := Config{Root: cfg.Root, Binary: cfg.Binary, ImageRoot: cfg.ImageRoot, NodeLink: cfg.NodeLink, ClientLink: cfg.NodeLink}
	e, down, err := dprgenTestbed(ctx, bc, log)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, down()) }()
	rep = &ARNABReport{Quick: cfg.Quick, Testbed: TestbedInfo{Name: e.st.Name, NodeRateBps: cfg.NodeLink.RateBps, NodeDelayMs: ms(cfg.NodeLink.Delay)}}
	var pm *podman
	for _, c := range cfg.grid() {
		for _, s := range cfg.Strategies {
			row := ARNABCase{Strategy: s, StateMB: c.stateMB, DirtyPct: c.dirtyPct}
			var rerr error
			if s == RsyncMethod {
				if pm == nil {
					if pm, rerr = newPodman(ctx, e); rerr == nil {
						defer func() { err = errors.Join(err, pm.close()) }()
					} else {
						pm = nil
					}
				}
				if pm != nil {
					rerr = e.arnabRsync(ctx, pm, c, cfg.RsyncRounds, &row)
				}
			} else {
				rerr = e.arnabEdgehop(ctx, c, s, &row)
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			row.OK = rerr == nil && strings.HasPrefix(row.Memory, "ok")
			if rerr != nil {
				row.Error = rerr.Error()
			} else if !row.OK {
				row.Error = "DPRGen's memory check failed: " + row.Memory
			}
			log.Info("arnab case", "strategy", s, "state_mb", c.stateMB, "dirty_pct", c.dirtyPct, "ok", row.OK, "downtime_ms", row.DowntimeMs, "err", row.Error)
			if cfg.Progress != nil {
				cfg.Progress(row)
			}
			rep.Cases = append(rep.Cases, row)
		}
	}
	arnabRatios(rep.Cases)
	rep.Goals = arnabGoals(rep.Cases)
	rep.ElapsedS = time.Since(start).Seconds()
	return rep, nil
}

// dprgenArgs runs DPRGen as ARNAB's RAM simulation: the state, a share of
// it rewritten once a second.
func dprgenArgs(c arnabCase) []string {
	return []string{"--state-mb", strconv.FormatFloat(c.stateMB, 'f', -1, 64),
		"--dirty-fraction", strconv.FormatFloat(c.dirtyPct/100, 'f', -1, 64)}
}

// arnabEdgehop migrates one DPRGen with an edgehop strategy.
func (e *env) arnabEdgehop(ctx context.Context, c arnabCase, strategy string, row *ARNABCase) error {
	name := "arnab"
	src, dst := e.node(nodeA).Name, e.node(nodeB).Name
	ctr, err := e.agents[src].Run(ctx, api.RunRequest{Name: name, Image: image.DPRGen, Args: dprgenArgs(c),
		Memory: bigServiceMemory})
	if err != nil {
		return fmt.Errorf("run dprgen: %w", err)
	}
	loc := src
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = e.agents[loc].Remove(rctx, name)
	}()
	addr := net.JoinHostPort(ctr.IP, strconv.Itoa(image.DPRGenPort))
	if err := e.dprgenReady(ctx, addr); err != nil {
		return err
	}
	var res migration.Result
	merr := e.agents[src].Migrate(ctx, name, api.MigrateRequest{To: dst, Strategy: strategy, LinkBps: int64(e.st.PathRate(src, dst))}, &res)
	row.DowntimeMs, row.TotalMs, row.BytesOnWire, row.PhasesMs = res.DowntimeMs, res.TotalMs, res.BytesOnWire, res.PhasesMs
	if merr != nil {
		return merr
	}
	if !res.OK {
		return errors.New(res.Error)
	}
	loc = dst
	row.Memory, err = dprgenCheck(ctx, e.client, addr)
	return err
}

// arnabRsync migrates one DPRGen in a podman container with ARNAB's method.
func (e *env) arnabRsync(ctx context.Context, pm *podman, c arnabCase, rounds int, row *ARNABCase) (err error) {
	s, err := pm.newService(ctx, "arnab", image.DPRGen, netip.MustParseAddr(arnabIP), dprgenArgs(c), nodeA)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := pm.remove(rctx, s); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove podman dprgen: %w", rerr))
		}
	}()
	if err := pm.start(ctx, s); err != nil {
		return err
	}
	addr := net.JoinHostPort(arnabIP, strconv.Itoa(image.DPRGenPort))
	if err := e.dprgenReady(ctx, addr); err != nil {
		return err
	}
	to := e.node(nodeB)
	sh, err := startRsync(ctx, to.NetNSPath, to.Address, filepath.Join(pm.scratch, "rsync"), rounds)
	if err != nil {
		return err
	}
	defer sh.close()
	r, err := pm.migrateWith(ctx, s, nodeB, sh)
	row.DowntimeMs, row.TotalMs, row.BytesOnWire = r.DowntimeMs, r.TotalMs, r.BytesOnWire
	if err != nil {
		return err
	}
	row.Memory, err = dprgenCheck(ctx, e.client, addr)
	return err
}

// dprgenReady waits until DPRGen answers and has run a little while (its
// dirty writer in its steady state).
func (e *env) dprgenReady(ctx context.Context, addr string) error {
	if err := waitListening(ctx, e.client, addr, 2*time.Minute); err != nil {
		return err
	}
	return sleep(ctx, 3*time.Second)
}

// dprgenCheck asks DPRGen at addr to verify its memory and returns its line.
func dprgenCheck(ctx context.Context, d nsDialer, addr string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := d.DialContext(cctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("dprgen after migration: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, "check\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// arnabRatios fills each case's ratios against stop-and-copy and the rsync
// method of the same service.
func arnabRatios(cases []ARNABCase) {
	find := func(strategy string, c ARNABCase) *ARNABCase {
		for i := range cases {
			if cases[i].Strategy == strategy && cases[i].StateMB == c.StateMB && cases[i].DirtyPct == c.DirtyPct && cases[i].OK {
				return &cases[i]
			}
		}
		return nil
	}
	for i := range cases {
		c := &cases[i]
		if !c.OK {
			continue
		}
		if b := find(string(migration.StopAndCopy), *c); b != nil {
			c.DowntimeVsStopAndCopy, c.TotalVsStopAndCopy = Ratio(b.DowntimeMs, c.DowntimeMs), Ratio(b.TotalMs, c.TotalMs)
		}
		if b := find(RsyncMethod, *c); b != nil {
			c.DowntimeVsRsync, c.TotalVsRsync = Ratio(b.DowntimeMs, c.DowntimeMs), Ratio(b.TotalMs, c.TotalMs)
		}
	}
}

// arnabGoals evaluates the goals on the 1.2 GB, 20 % case: the best
// edgehop strategy's downtime at most 1 s; and post-copy at line rate, the
// whole migration within 11 s (at least 90 % of 1 Gbit/s) with at most
// 200 ms of downtime.
func arnabGoals(cases []ARNABCase) []Goal {
	best := Goal{Name: "1.2 GB at 20% dirty, best edgehop downtime", Target: "<= 1000 ms"}
	total := Goal{Name: "1.2 GB at 20% dirty, post-copy total (line rate)", Target: "<= 11000 ms"}
	down := Goal{Name: "1.2 GB at 20% dirty, post-copy downtime", Target: "<= 200 ms"}
	for _, c := range cases {
		if c.StateMB != 1200 || c.DirtyPct != 20 || !c.OK || c.Strategy == RsyncMethod {
			continue
		}
		if best.Measured == nil || c.DowntimeMs < *best.Measured {
			best.Measured = new(c.DowntimeMs)
		}
		if c.Strategy == string(migration.PostCopy) {
			total.Measured, down.Measured = new(c.TotalMs), new(c.DowntimeMs)
		}
	}
	met := func(g *Goal, limit float64) { g.Met = g.Measured != nil && *g.Measured <= limit }
	met(&best, 1000)
	met(&total, 11000)
	met(&down, 200)
	return []Goal{best, total, down}
}

// WriteText prints the report as a table.
func (r *ARNABReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "ARNAB Fig. 6 on %s (node links %s, one-way delay %.1f ms)\n", r.Testbed.Name, units.FormatRate(r.Testbed.NodeRateBps), r.Testbed.NodeDelayMs)
	fmt.Fprintf(&b, "%-14s %8s %6s %12s %12s %14s %9s %9s  %s\n", "strategy", "state MB", "dirty%", "downtime ms", "total ms", "bytes on wire", "vs s&c", "vs rsync", "memory / error")
	for _, c := range r.Cases {
		what := c.Memory
		if !c.OK {
			what = "FAILED: " + c.Error
		}
		fmt.Fprintf(&b, "%-14s %8.0f %6.0f %12.1f %12.1f %14d %9s %9s  %s\n", c.Strategy, c.StateMB, c.DirtyPct,
			c.DowntimeMs, c.TotalMs, c.BytesOnWire, ratioString(c.DowntimeVsStopAndCopy), ratioString(c.DowntimeVsRsync), what)
	}
	for _, g := range r.Goals {
		m := "not measured (full grid only)"
		if g.Measured != nil {
			m = fmt.Sprintf("%.1f ms, met: %v", *g.Measured, g.Met)
		}
		fmt.Fprintf(&b, "goal %s %s: %s\n", g.Name, g.Target, m)
	}
	fmt.Fprintf(&b, "ratios are the baseline's downtime over this row's (above 1: this row is better); elapsed %.0f s\n", r.ElapsedS)
	_, err := io.WriteString(w, b.String())
	return err
}

func ratioString(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f×", *r)
}

// dprgenTestbed checks that the dprgen image is in the cache and brings up
// the benchmarks' testbed (upTestbed).
func dprgenTestbed(ctx context.Context, bc Config, log *slog.Logger) (*env, func() error, error) {
	if _, err := image.Resolve(bc.ImageRoot, image.DPRGen); err != nil {
		return nil, nil, fmt.Errorf("image %s: %w (run 'edgehop image build dprgen')", image.DPRGen, err)
	}
	return upTestbed(ctx, bc, log)
}

// orDiscard returns log, or a logger that discards when it is nil.
func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}

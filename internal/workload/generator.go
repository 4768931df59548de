package workload

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Config describes one DPRGen process.
type Config struct {
	StateBytes    int64         // M; rounded down to whole pages
	Rate          string        // "min", "max" or pages per second
	DirtyFraction float64       // (0, 1): only this share of the pages is rewritten; 0: all
	Interval      time.Duration // ΔT of R_min = 1 page/ΔT and R_max = hot/ΔT
	Seed          uint64
	Tick          time.Duration // how often due writes are done
	MaxGap        time.Duration // a longer silence is a freeze the pacing skips (Pacer)
}

// DefaultConfig is the paper's setting: ΔT = 1 s, R = R_max, writes every
// 10 ms, and a silence over 250 ms taken for a freeze.
func DefaultConfig() Config {
	return Config{Rate: "max", Interval: time.Second, Seed: 1, Tick: 10 * time.Millisecond, MaxGap: 250 * time.Millisecond}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	switch {
	case Pages(c.StateBytes) < 1:
		return fmt.Errorf("%w: state %d bytes holds no page of %d bytes", ErrBadSize, c.StateBytes, PageSize)
	case c.DirtyFraction < 0 || c.DirtyFraction > 1:
		return fmt.Errorf("dirty fraction %v out of [0, 1]", c.DirtyFraction)
	case c.Interval <= 0 || c.Tick <= 0 || c.MaxGap <= 0:
		return fmt.Errorf("interval %v, tick %v and max gap %v must be positive", c.Interval, c.Tick, c.MaxGap)
	case c.MaxGap < c.Tick:
		return fmt.Errorf("max gap %v shorter than the tick %v", c.MaxGap, c.Tick)
	}
	_, err := ResolveRate(c.Rate, HotPages(Pages(c.StateBytes), c.DirtyFraction), c.Interval)
	return err
}

// Generator is a running DPRGen: the memory and the pacer that dirties
// it. Safe for concurrent use; Run is called once.
type Generator struct {
	cfg  Config
	mem  *Memory
	rate float64

	mu    sync.Mutex // guards pacer; held by Check so no tick sees its pause
	pacer *Pacer
}

// NewGenerator allocates and fills the state (this takes a while for large
// states: every page is written once).
func NewGenerator(cfg Config) (*Generator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pages := Pages(cfg.StateBytes)
	hot := HotPages(pages, cfg.DirtyFraction)
	rate, err := ResolveRate(cfg.Rate, hot, cfg.Interval)
	if err != nil {
		return nil, err
	}
	mem, err := NewMemory(cfg.Seed, pages, hot)
	if err != nil {
		return nil, err
	}
	return &Generator{cfg: cfg, mem: mem, rate: rate}, nil
}

// Memory returns the generator's state.
func (g *Generator) Memory() *Memory { return g.mem }

// Run dirties the memory at the rate until ctx ends.
func (g *Generator) Run(ctx context.Context) error {
	p, err := NewPacer(g.rate, g.cfg.MaxGap, time.Now())
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.pacer = p
	g.mu.Unlock()
	t := time.NewTicker(g.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			g.mu.Lock()
			n := g.pacer.Due(now)
			g.mu.Unlock()
			g.mem.Write(n)
		}
	}
}

// Check verifies the whole state (Memory.Check). Writes wait while it
// runs, and the pacer resumes afterwards without taking the pause for a
// freeze.
func (g *Generator) Check() CheckResult {
	g.mu.Lock()
	defer g.mu.Unlock()
	res := g.mem.Check()
	if g.pacer != nil {
		g.pacer.Resume(time.Now())
	}
	return res
}

// Stats describes the generator.
type Stats struct {
	Pages  int     `json:"pages"`
	Hot    int     `json:"hot"`
	Writes uint64  `json:"writes"`
	Rate   float64 `json:"rate"` // pages per second
	Gaps   int     `json:"gaps"` // freezes (silences over MaxGap) the pacer skipped
	Seed   uint64  `json:"seed"`
}

// Stats returns the generator's counters.
func (g *Generator) Stats() Stats {
	s := Stats{Pages: g.mem.Pages(), Hot: g.mem.Hot(), Writes: g.mem.Writes(), Rate: g.rate, Seed: g.mem.Seed()}
	g.mu.Lock()
	if g.pacer != nil {
		s.Gaps = g.pacer.Gaps()
	}
	g.mu.Unlock()
	return s
}

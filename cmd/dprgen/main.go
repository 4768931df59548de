// Command dprgen is DPRGen, the dirty page rate generator of COAT (Calagna
// et al., Sec. IV-A), the program of the "dprgen" image: it holds a state
// of M MB (10^6 bytes) as a circular buffer of 4096-byte pages filled with
// random bytes and dirties R pages per second, and it verifies its own
// memory on request (see internal/workload).
//
//	dprgen --state-mb M --rate R [--seed S] [--port P] [--interval 1s]
//	dprgen --dirty-fraction 0.2 [--state-mb 1200] [--rate R]
//
// R is "min" (1 page per ΔT), "max" (every page of the cycle once per ΔT,
// the default) or pages per second. With --dirty-fraction F it is ARNAB's
// RAM simulation: only the first ⌈F·pages⌉ pages are rewritten, by default
// once per ΔT, and the state defaults to 1.2 GB.
//
// It listens on plain TCP (never MPTCP, which CRIU cannot dump) and answers
// "check", "stats" and "ping" lines. It is built static (CGO_ENABLED=0) and
// survives CRIU checkpoint/restore with --tcp-established: its pacing
// skips the time of a freeze instead of catching up.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/workload"
)

// arnabStateMB is the state of ARNAB's RAM simulation (1.2 GB).
const arnabStateMB = 1200

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "dprgen: %v\n", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(args []string) error {
	def := workload.DefaultConfig()
	fs := flag.NewFlagSet("dprgen", flag.ContinueOnError)
	stateMB := fs.Float64("state-mb", 0, "state size M in MB (10^6 bytes); default 10, or 1200 with --dirty-fraction")
	rate := fs.String("rate", "", "dirty rate R: min, max or pages per second (default max)")
	seed := fs.Uint64("seed", def.Seed, "seed of the page contents")
	port := fs.Int("port", workload.DefaultPort, "TCP port of the check protocol")
	fraction := fs.Float64("dirty-fraction", 0, "ARNAB RAM simulation: share of the state rewritten continuously, in (0, 1]")
	interval := fs.Duration("interval", def.Interval, "ΔT: R_min is 1 page per ΔT, R_max every page once per ΔT")
	tick := fs.Duration("tick", def.Tick, "how often due writes are done")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %v", errUsage, fs.Args())
	}
	cfg := def
	cfg.Seed, cfg.Interval, cfg.Tick, cfg.DirtyFraction = *seed, *interval, *tick, *fraction
	cfg.MaxGap = max(def.MaxGap, 5**tick)
	mb := *stateMB
	if mb == 0 {
		mb = 10
		if *fraction > 0 {
			mb = arnabStateMB
		}
	}
	if !(mb > 0) || math.IsInf(mb, 0) {
		return fmt.Errorf("%w: --state-mb %v must be positive", errUsage, mb)
	}
	cfg.StateBytes = int64(mb * 1e6)
	if *rate != "" {
		cfg.Rate = *rate
	}
	if *port < 1 || *port > 65535 {
		return fmt.Errorf("%w: --port %d", errUsage, *port)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	t0 := time.Now()
	g, err := workload.NewGenerator(cfg)
	if err != nil {
		return err
	}
	ln, err := workload.Listen(ctx, fmt.Sprintf(":%d", *port))
	if err != nil {
		return err
	}
	st := g.Stats()
	fmt.Printf("dprgen: state %d pages of %d bytes (%.1f MB), %d rewritten, rate %g pages/s, seed %d, filled in %v, listening on %s\n",
		st.Pages, workload.PageSize, float64(st.Pages*workload.PageSize)/1e6, st.Hot, st.Rate, st.Seed, time.Since(t0).Round(time.Millisecond), ln.Addr())

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var genErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		genErr = g.Run(ctx)
		cancel()
	}()
	serveErr := workload.Serve(ctx, ln, g)
	cancel()
	wg.Wait()
	return errors.Join(serveErr, genErr)
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/model"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/transfer"
	"github.com/edgehop/edgehop/internal/units"
)

func init() {
	register(command{name: "migrate", summary: "live-migrate a container, or a group of them as one: migrate NAME|GROUP --to NODE [--strategy stop-and-copy|post-copy|pre-copy|hybrid|auto] [--json]", run: runMigrate})
}

// parseInterleaved parses flags that may come before or after positional
// arguments (`migrate NAME --to N`), returning the positionals.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func runMigrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	to := fs.String("to", "", "destination node")
	strategy := fs.String("strategy", string(migration.StopAndCopy), "stop-and-copy | post-copy | pre-copy | hybrid | auto")
	rounds := fs.Int("rounds", 0, fmt.Sprintf("pre-copy: most live rounds (0: %d, or the planner's iterations with auto)", migration.DefaultRounds))
	compress := fs.String("compress", "auto", "state streams: off | zstd | auto (zstd only while it raises throughput on this path's link)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	timeout := fs.Duration("timeout", 10*time.Minute, "stop following after this long (the migration goes on on the agent; see 'edgehop migrations')")
	maxFrozen := fs.Duration("max-frozen", 0, "roll the service back on the source if it stays frozen this long (0: from the state's size, see README)")
	planOnly := fs.Bool("plan", false, "print the steps of the strategy on both sides and exit")
	maxDown := fs.Float64("max-downtime-ms", 0, "auto: the downtime target")
	maxTotal := fs.Float64("max-total-ms", 0, "auto: the total-time target")
	dirty := fs.String("dirty-rate", "min", "auto: the service's dirty rate (min, max, r=X or pages/s)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if _, err := migration.ParseStrategy(*strategy); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *planOnly {
		p, err := migration.PlanFor(migration.Strategy(*strategy))
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if *asJSON {
			return printJSON(p)
		}
		fmt.Print(p)
		return nil
	}
	if len(pos) != 1 || *to == "" {
		return fmt.Errorf("%w: edgehop migrate NAME --to NODE [--strategy S] [--json]", errUsage)
	}
	if *maxFrozen < 0 {
		return fmt.Errorf("%w: --max-frozen %v < 0", errUsage, *maxFrozen)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	if _, ok := st.Node(*to); !ok {
		return fmt.Errorf("unknown destination node %q (see 'edgehop testbed status')", *to)
	}
	if _, err := transfer.ParseCompression(*compress); err != nil {
		return fmt.Errorf("%w: --compress: %v", errUsage, err)
	}
	if *rounds < 0 {
		return fmt.Errorf("%w: --rounds %d < 0", errUsage, *rounds)
	}
	ctr, members, err := findTarget(ctx, st, pos[0])
	if err != nil {
		return err
	}
	node := ctr.Node
	if members != nil {
		// Not a container: a group of them, which moves as one.
		if migration.Strategy(*strategy) == migration.Auto {
			return fmt.Errorf("%w: --strategy auto plans one container; give a group a strategy", errUsage)
		}
		return migrateGroup(ctx, st, pos[0], members, api.MigrateRequest{To: *to, Strategy: *strategy, Rounds: *rounds,
			Compression: *compress, MaxFrozenMs: maxFrozen.Milliseconds()}, *asJSON, *timeout)
	}
	linkBps := st.PathRate(node, *to)
	var plan *model.PlanResult
	if migration.Strategy(*strategy) == migration.Auto {
		p, err := planMigration(st, ctr, node, *to, *dirty, *maxDown, *maxTotal)
		if err != nil {
			return err
		}
		plan = &p
		*strategy = string(p.Choice.Strategy)
		if *rounds == 0 && p.Choice.Iterations > 0 {
			*rounds = p.Choice.Iterations
		}
	}
	client := agents(st)[node]
	job, err := client.StartMigration(ctx, pos[0], api.MigrateRequest{To: *to, Strategy: *strategy, Rounds: *rounds,
		Compression: *compress, LinkBps: int64(linkBps), MaxFrozenMs: maxFrozen.Milliseconds()})
	if err != nil {
		return err
	}
	var show func(api.Progress)
	tty := !*asJSON && linux.IsTerminal(os.Stderr)
	if tty {
		show = func(p api.Progress) { fmt.Fprintf(os.Stderr, "\r\033[K%s", progressLine(job.ID, p)) }
	}
	fctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	done, err := client.FollowJob(fctx, job.ID, show)
	if tty {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
	if err != nil {
		if ctx.Err() != nil {
			// Interrupted: cancel if the service is not frozen yet.
			cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer ccancel()
			if cerr := client.CancelJob(cctx, job.ID); cerr != nil {
				return fmt.Errorf("migration %s goes on on %s (%v); follow it with 'edgehop migrations --node %s'", job.ID, node, cerr, node)
			}
			return fmt.Errorf("migration %s cancelled before the freeze; %s still runs on %s", job.ID, pos[0], node)
		}
		return fmt.Errorf("migration %s: %w (it goes on on %s; see 'edgehop migrations --node %s')", job.ID, err, node, node)
	}
	var res migration.Result
	if len(done.Result) > 0 {
		if err := json.Unmarshal(done.Result, &res); err != nil {
			return fmt.Errorf("migration %s: result: %w", job.ID, err)
		}
	}
	if *asJSON {
		out := struct {
			migration.Result
			Plan *model.PlanResult `json:"plan,omitempty"`
		}{res, plan}
		if err := printJSON(out); err != nil {
			return err
		}
	} else if res.OK {
		if plan != nil {
			fmt.Printf("auto: %s (%s)\n", plan.Choice.Strategy, plan.Reason)
		}
		fmt.Printf("%s: %s -> %s (%s) downtime %.1f ms, total %.1f ms, %d bytes on the wire [migration %s]\n",
			res.Container, res.From, res.To, res.Strategy, res.DowntimeMs, res.TotalMs, res.BytesOnWire, res.ID)
	}
	if !res.OK {
		if res.Error == "" {
			res.Error = "ended " + done.State
		}
		return fmt.Errorf("migration of %s failed: %s", pos[0], res.Error)
	}
	return nil
}

// progressLine renders a job's progress on one terminal line.
func progressLine(id string, p api.Progress) string {
	line := fmt.Sprintf("migration %s: %-11s %-28s %s", id, p.Phase, p.Step, units.FormatSize(p.BytesSent))
	if p.BytesTotal > 0 {
		line += " of ~" + units.FormatSize(p.BytesTotal)
	}
	if p.RateBps > 0 {
		line += fmt.Sprintf(" at %.0f Mbit/s", p.RateBps/1e6)
	}
	if p.ETASeconds > 0 {
		line += fmt.Sprintf(", ETA %.1f s", p.ETASeconds)
	}
	return line
}

// implemented lists the strategies the agents carry out; the planner
// chooses among them.
var implemented = []model.Strategy{model.Strategy(migration.StopAndCopy), model.Strategy(migration.PostCopy), model.Strategy(migration.PreCopy), model.Strategy(migration.Hybrid)}

// planMigration asks the performance model how to move ctr from node to
// dest: state size from the container's memory, bandwidth from the
// narrower of the two nodes' links.
func planMigration(st *testbed.State, ctr api.Container, node, dest, dirty string, maxDown, maxTotal float64) (model.PlanResult, error) {
	bw := float64(st.PathRate(node, dest))
	if bw == 0 {
		bw = math.Inf(1)
	}
	m := float64(ctr.MemoryBytes)
	if m <= 0 {
		m = 1 << 20
	}
	p := model.DefaultParams()
	r, err := model.ResolveDirtyRate(p, m, dirty)
	if err != nil {
		return model.PlanResult{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	res, err := model.Plan(p, model.Request{
		Inputs:        model.Inputs{StateBytes: m, DirtyRate: r.PagesPerSecond, BandwidthBps: bw},
		MaxDowntimeMs: maxDown, MaxTotalMs: maxTotal, Strategies: implemented,
	})
	if err != nil && res.Choice.Strategy == "" {
		return res, fmt.Errorf("plan: %w", err)
	}
	return res, nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
)

func init() {
	register(command{name: "migrate", summary: "live-migrate a container: migrate NAME --to NODE [--strategy stop-and-copy|post-copy] [--json]", run: runMigrate})
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
	strategy := fs.String("strategy", string(migration.StopAndCopy), "stop-and-copy | post-copy | auto")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up (and roll back) after this long")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *to == "" {
		return fmt.Errorf("%w: edgehop migrate NAME --to NODE [--strategy S] [--json]", errUsage)
	}
	if _, err := migration.ParseStrategy(*strategy); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	if _, ok := st.Node(*to); !ok {
		return fmt.Errorf("unknown destination node %q (see 'edgehop testbed status')", *to)
	}
	node, _, err := findContainer(ctx, st, pos[0])
	if err != nil {
		return err
	}
	mctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var res migration.Result
	merr := agents(st)[node].Migrate(mctx, pos[0], api.MigrateRequest{To: *to, Strategy: *strategy}, &res)
	if merr != nil {
		return merr
	}
	if *asJSON {
		if err := printJSON(res); err != nil {
			return err
		}
	} else if res.OK {
		fmt.Printf("%s: %s -> %s (%s) downtime %.1f ms, total %.1f ms, %d bytes on the wire\n",
			res.Container, res.From, res.To, res.Strategy, res.DowntimeMs, res.TotalMs, res.BytesOnWire)
	}
	if !res.OK {
		return fmt.Errorf("migration of %s failed: %s", pos[0], res.Error)
	}
	return nil
}

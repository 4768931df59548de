package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"text/tabwriter"

	"github.com/edgehop/edgehop/internal/api"
)

func init() {
	register(command{name: "migrations", summary: "list running and past migration jobs: migrations [--node N] [--json]", run: runMigrations})
}

func runMigrations(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrations", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	node := fs.String("node", "", "only this node's jobs (default: every node)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	clients := agents(st)
	if *node != "" {
		c, err := agentOf(st, *node)
		if err != nil {
			return err
		}
		clients = map[string]*api.Client{*node: c}
	}
	var all []api.Job
	var errs []error
	for name, c := range clients {
		js, err := c.Jobs(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", name, err))
			continue
		}
		all = append(all, js...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Started.Before(all[j].Started) })
	if *asJSON {
		if all == nil {
			all = []api.Job{}
		}
		if err := printJSON(all); err != nil {
			return err
		}
		return errors.Join(errs...)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNODE\tROLE\tCONTAINER\tFROM\tTO\tSTRATEGY\tSTATE\tPHASE\tSTARTED")
	for _, j := range all {
		phase := ""
		if j.Progress != nil {
			phase = j.Progress.Phase
		}
		if j.State == "queued" {
			phase = j.Reason
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.Node, j.Role, j.Container, j.From, j.To,
			j.Strategy, j.State, phase, j.Started.Local().Format("15:04:05"))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

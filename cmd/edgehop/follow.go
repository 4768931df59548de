package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgehop/edgehop/internal/controller"
	"github.com/edgehop/edgehop/internal/policy"
	"github.com/edgehop/edgehop/internal/topo"
)

func init() {
	register(command{name: "nodes", summary: "the controller's view of the edge nodes: nodes [--json]", run: runNodes})
	register(command{name: "users", summary: "users, their position and access point: users [--json]", run: runUsers})
	register(command{name: "services", summary: "services that follow users: services [--json]", run: runServices})
	register(command{name: "decisions", summary: "the controller's policy decisions with their inputs and reasons: decisions [--limit N] [--json]", run: runDecisions})
	register(command{name: "user", summary: "user add NAME [--address IP] --x X [--y Y] | user move NAME --x X [--y Y]", run: runUser})
	register(command{name: "follow", summary: "make a service follow a user: follow SERVICE --user U --node N [--policy latency|region|teka|throughput|model]", run: runFollow})
}

// ctlFlags are the flags of the commands that talk to the controller.
type ctlFlags struct {
	tb         tbFlags
	url, token string
}

func (f *ctlFlags) register(fs *flag.FlagSet) {
	f.tb.register(fs)
	fs.StringVar(&f.url, "controller", envOr("EDGEHOP_CONTROLLER", ""), "controller URL (default: the testbed's; env EDGEHOP_CONTROLLER)")
	fs.StringVar(&f.token, "token", envOr("EDGEHOP_CONTROLLER_TOKEN", ""),
		"the controller's API token (default: read from the testbed's token file; env EDGEHOP_CONTROLLER_TOKEN, which other users cannot see in ps)")
}

// client authenticates with --token, else with the testbed's token when
// the controller is the testbed's.
func (f *ctlFlags) client() (*controller.Client, error) {
	if f.url != "" && f.token != "" {
		return controller.NewClient(f.url, f.token), nil
	}
	st, err := f.tb.load()
	if f.url != "" {
		tok := ""
		if err == nil && strings.TrimRight(st.Controller.URL, "/") == strings.TrimRight(f.url, "/") {
			tok, _ = st.Controller.Token()
		}
		return controller.NewClient(f.url, tok), nil // no token: the controller's 401 says how to get one
	}
	if err != nil {
		return nil, err
	}
	if st.Controller.URL == "" {
		return nil, fmt.Errorf("testbed %s runs no controller; give --controller URL", st.Name)
	}
	if f.token != "" {
		return controller.NewClient(st.Controller.URL, f.token), nil
	}
	return st.Controller.Client()
}

func ctlCommand(name string, args []string, extra func(fs *flag.FlagSet)) (*controller.Client, *flag.FlagSet, bool, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var cf ctlFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if extra != nil {
		extra(fs)
	}
	if _, err := parseInterleaved(fs, args); err != nil {
		return nil, nil, false, err
	}
	c, err := cf.client()
	return c, fs, *asJSON, err
}

func runNodes(ctx context.Context, args []string) error {
	c, _, asJSON, err := ctlCommand("nodes", args, nil)
	if err != nil {
		return err
	}
	ns, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(ns)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tREGION\tPOSITION\tALIVE\tCONTAINERS\tNEIGHBOUR RTT (ms)")
	for _, n := range ns {
		var rtts []string
		for k, v := range n.NeighbourRTTMs {
			rtts = append(rtts, fmt.Sprintf("%s=%.1f", k, v))
		}
		sort.Strings(rtts)
		fmt.Fprintf(w, "%s\t%s\t(%.0f,%.0f)\t%t\t%s\t%s\n", n.Name, n.Region, n.Pos.X, n.Pos.Y, n.Alive, strings.Join(n.Containers, ","), strings.Join(rtts, " "))
	}
	return w.Flush()
}

func runUsers(ctx context.Context, args []string) error {
	c, _, asJSON, err := ctlCommand("users", args, nil)
	if err != nil {
		return err
	}
	us, err := c.Users(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(us)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "USER\tPOSITION\tAP\tREGION\tRSSI\tRTT TO NODES (ms)\tTHROUGHPUT")
	for _, u := range us {
		var rtts []string
		for k, v := range u.RTTMs {
			rtts = append(rtts, fmt.Sprintf("%s=%.1f", k, v))
		}
		sort.Strings(rtts)
		fmt.Fprintf(w, "%s\t(%.0f,%.0f)\t%s\t%s\t%.1f dBm\t%s\t%.0f op/s\n", u.Name, u.Pos.X, u.Pos.Y, u.AP, u.Region, u.RSSI, strings.Join(rtts, " "), u.ThroughputOps)
	}
	return w.Flush()
}

func runServices(ctx context.Context, args []string) error {
	c, _, asJSON, err := ctlCommand("services", args, nil)
	if err != nil {
		return err
	}
	ss, err := c.Services(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(ss)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tUSER\tNODE\tPOLICY\tMIGRATING\tLAST MIGRATION")
	for _, s := range ss {
		last := "-"
		if !s.LastMigration.IsZero() {
			last = s.LastMigration.Local().Format("15:04:05")
		}
		node := s.Node
		if s.Split != nil {
			node = strings.Join(s.Split, "+") + " (split)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.User, node, s.Policy.Kind, s.Migrating, last)
	}
	return w.Flush()
}

func runDecisions(ctx context.Context, args []string) error {
	var limit *int
	c, _, asJSON, err := ctlCommand("decisions", args, func(fs *flag.FlagSet) { limit = fs.Int("limit", 20, "how many, newest first") })
	if err != nil {
		return err
	}
	es, err := c.History(ctx, controller.KindDecisions, *limit)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(es)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TIME\tSERVICE\tPOLICY\tMIGRATE\tFROM\tTO\tREASON")
	for _, e := range es {
		var d controller.DecisionRecord
		if json.Unmarshal(e.Data, &d) != nil {
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%t\t%s\t%s\t%s\n", d.Time.Local().Format("15:04:05.000"), d.Service, d.Policy, d.Migrate, d.From, d.To, d.Reason)
	}
	return w.Flush()
}

func runUser(ctx context.Context, args []string) error {
	if len(args) < 2 || (args[0] != "add" && args[0] != "move") {
		return fmt.Errorf("%w: edgehop user add NAME [--address IP] --x X [--y Y] | edgehop user move NAME --x X [--y Y]", errUsage)
	}
	verb := args[0]
	var x, y *float64
	var addr *string
	c, fs, asJSON, err := ctlCommand("user "+verb, args[1:], func(fs *flag.FlagSet) {
		x = fs.Float64("x", 0, "position, metres")
		y = fs.Float64("y", 0, "position, metres")
		addr = fs.String("address", "", "the device's address (add; agents measure their RTT to it)")
	})
	if err != nil {
		return err
	}
	name := args[1]
	_ = fs
	p := topo.Point{X: *x, Y: *y}
	var out any
	if verb == "add" {
		out, err = c.AddUser(ctx, controller.AddUserRequest{Name: name, Address: *addr, Pos: p})
	} else {
		var res controller.MoveResult
		res, err = c.Move(ctx, name, p)
		out = res
		if err == nil && !asJSON {
			fmt.Printf("%s at (%.0f, %.0f) on %s (%s, %.1f dBm)\n", name, p.X, p.Y, res.User.AP, res.User.Region, res.User.RSSI)
			if res.Handoff != nil {
				fmt.Printf("handoff %s -> %s in %.1f ms: %s\n", res.Handoff.FromAP, res.Handoff.ToAP, res.Handoff.InterruptionMs, res.Handoff.Reason)
			}
			for _, d := range res.Decisions {
				fmt.Printf("%s (%s): %s\n", d.Service, d.Policy, d.Reason)
			}
			return nil
		}
	}
	if err != nil {
		return err
	}
	return printJSON(out)
}

func runFollow(ctx context.Context, args []string) error {
	var user, node, kind, strategy *string
	var threshold, minOps, target *float64
	var hops *int
	var reunite *time.Duration
	c, fs, _, err := ctlCommand("follow", args, func(fs *flag.FlagSet) {
		user = fs.String("user", "", "the user the service follows")
		node = fs.String("node", "", "the node the service runs on now")
		kind = fs.String("policy", policy.KindLatency, strings.Join(policy.Kinds(), " | "))
		strategy = fs.String("strategy", "", "migration strategy (default stop-and-copy; the model policy chooses its own)")
		threshold = fs.Float64("threshold-ms", 0, "latency policy: the threshold")
		hops = fs.Int("max-hops", 0, "region policy: the hop limit")
		minOps = fs.Float64("min-ops", 0, "throughput policy: the threshold in operations per second")
		target = fs.Float64("downtime-target-ms", 0, "model policy: the downtime target")
		reunite = fs.Duration("reunite-after", 0, "a group split across two nodes this long is made whole on the one nearer the user (default 30s)")
	})
	if err != nil {
		return err
	}
	if fs.NArg() < 1 && len(args) == 0 {
		return fmt.Errorf("%w: edgehop follow SERVICE --user U --node N", errUsage)
	}
	name := args[0]
	s, err := c.AddService(ctx, controller.AddServiceRequest{Name: name, User: *user, Node: *node,
		Policy: policy.Config{Kind: *kind, Strategy: *strategy, ThresholdMs: *threshold, MaxHops: *hops, MinOps: *minOps, DowntimeTargetMs: *target,
			ReuniteAfter: *reunite}})
	if err != nil {
		return err
	}
	return printJSON(s)
}

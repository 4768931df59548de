package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/migration"
	"github.com/edgehop/edgehop/internal/testbed"
)

// membersOf picks the containers of group out of all, by name.
func membersOf(all []api.Container, group string) []api.Container {
	var out []api.Container
	for _, c := range all {
		if c.Group == group {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// byDependency orders a group's members so that each comes after the
// members it depends on (by name among equals; members of a cycle last).
func byDependency(members []api.Container) []api.Container {
	done := map[string]bool{}
	in := map[string]bool{}
	for _, m := range members {
		in[m.Name] = true
	}
	var out []api.Container
	for len(out) < len(members) {
		progressed := false
		for _, m := range members {
			if done[m.Name] {
				continue
			}
			ready := true
			for _, d := range m.After {
				ready = ready && (done[d] || !in[d])
			}
			if ready {
				done[m.Name], progressed = true, true
				out = append(out, m)
			}
		}
		if !progressed { // a cycle: the rest as they are
			for _, m := range members {
				if !done[m.Name] {
					done[m.Name] = true
					out = append(out, m)
				}
			}
		}
	}
	return out
}

// GroupResult is a group migration's outcome: each member's result, and
// the members migrated back to the source when others failed after they
// had moved (the unit ends where it started).
type GroupResult struct {
	Group      string             `json:"group"`
	From       string             `json:"from"`
	To         string             `json:"to"`
	OK         bool               `json:"ok"`
	DowntimeMs float64            `json:"downtime_ms"` // the longest member's: they freeze together
	TotalMs    float64            `json:"total_ms"`
	Members    []migration.Result `json:"members"`
	Back       []migration.Result `json:"moved_back,omitempty"`
	Error      string             `json:"error,omitempty"`
}

// migrateGroup moves the group's members (all on one node) to r.To as
// one unit, and brings back any that moved when another failed. A group
// split between two nodes (a member moved alone) is made whole on r.To
// when r.To is one of them: the other node's members move there as one.
func migrateGroup(ctx context.Context, st *testbed.State, group string, members []api.Container, r api.MigrateRequest, asJSON bool, timeout time.Duration) error {
	from, rejoin, err := groupSource(group, members, r.To)
	if err != nil {
		return err
	}
	r.LinkBps = int64(st.PathRate(from, r.To))
	clients := agents(st)
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res := GroupResult{Group: group, From: from, To: r.To}
	if res.Members, err = runGroupJobs(fctx, clients[from], group, r); err != nil {
		return err
	}
	unit := migration.UnitResult(res.Members)
	res.OK, res.DowntimeMs, res.TotalMs = unit.OK, unit.DowntimeMs, unit.TotalMs
	if !res.OK {
		res.Error = "the group stays on " + from + ": " + unit.Error
		if rejoin {
			res.Error = "the group stays split between " + from + " and " + r.To + ": " + unit.Error
		}
		var moved []string
		for _, m := range res.Members {
			if m.OK {
				moved = append(moved, m.Container)
			}
		}
		if len(moved) > 0 && rejoin {
			// The destination's own members never left it: moving the
			// group "back" would take them too.
			res.Error += fmt.Sprintf("; %v moved to %s nevertheless", moved, r.To)
		} else if len(moved) > 0 {
			// Restored there after the unit committed, while another
			// member's restore failed: move them back, as one.
			back := r
			back.To, back.LinkBps = from, int64(st.PathRate(r.To, from))
			var berr error
			if res.Back, berr = runGroupJobs(fctx, clients[r.To], group, back); berr != nil {
				res.Error += fmt.Sprintf("; moving %v back to %s failed: %v", moved, from, berr)
			}
			for _, b := range res.Back {
				if !b.OK {
					res.Error += fmt.Sprintf("; %s could not move back: %s", b.Container, b.Error)
				}
			}
		}
	}
	if asJSON {
		if perr := printJSON(res); perr != nil {
			return perr
		}
	} else if res.OK {
		fmt.Printf("group %s: %s -> %s, downtime %.1f ms (longest member), total %.1f ms\n", group, from, r.To, res.DowntimeMs, res.TotalMs)
		for _, m := range res.Members {
			fmt.Printf("  %s: downtime %.1f ms, %d bytes on the wire\n", m.Container, m.DowntimeMs, m.BytesOnWire)
		}
	}
	if !res.OK {
		return fmt.Errorf("migration of group %s failed: %s", group, res.Error)
	}
	return nil
}

// runGroupJobs starts a group migration on client's agent and follows
// every member's job to its end.
func runGroupJobs(ctx context.Context, client *api.Client, group string, r api.MigrateRequest) ([]migration.Result, error) {
	jobs, err := client.MigrateGroup(ctx, group, r)
	if err != nil {
		return nil, err
	}
	return groupResults(jobs)
}

// groupResults decodes the members' results from their ended jobs; a job
// that ended without one is a failed member.
func groupResults(jobs []api.Job) ([]migration.Result, error) {
	out := make([]migration.Result, len(jobs))
	for i, j := range jobs {
		var err error
		if out[i], err = j.MigrationResult(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// groupSource is the node a migration of group to dest moves members
// from: the one node other than dest that holds members. rejoin: dest
// holds members too (the group runs split and this makes it whole).
func groupSource(group string, members []api.Container, dest string) (from string, rejoin bool, err error) {
	var others []string
	for _, m := range members {
		switch {
		case m.Node == dest:
			rejoin = true
		case !slices.Contains(others, m.Node):
			others = append(others, m.Node)
		}
	}
	switch len(others) {
	case 0:
		return "", false, fmt.Errorf("group %s already runs on %s", group, dest)
	case 1:
		return others[0], rejoin, nil
	}
	if rejoin {
		others = append(others, dest)
	}
	sort.Strings(others)
	return "", false, fmt.Errorf("group %s runs split across %s and a group moves from one node: gather it on one of them first, member by member ('edgehop migrate MEMBER --to %s'), or, split between two nodes, as one ('edgehop migrate %s --to %s')",
		group, strings.Join(others, ", "), others[0], group, others[0])
}

package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
)

func init() {
	register(command{name: "run", summary: "run a container on a node: run --node N --name S --image I [--ip A] [--memory 512m --pids 1024 --cpus 1.5] -- CMD…", run: runRun})
	register(command{name: "ps", summary: "list containers on every node", run: runPs})
	register(command{name: "logs", summary: "print a container's output (a group's: each member's)", run: runLogs})
	register(command{name: "rm", summary: "stop and remove a container (a group: every member)", run: runRm})
}

// agents returns a client per node of the testbed.
func agents(st *testbed.State) map[string]*api.Client {
	out := map[string]*api.Client{}
	for _, n := range st.Nodes {
		out[n.Name] = api.NewUnixClient(n.Socket)
	}
	return out
}

// agentOf is the client of node's agent in st.
func agentOf(st *testbed.State, node string) (*api.Client, error) {
	c, ok := agents(st)[node]
	if !ok {
		return nil, fmt.Errorf("unknown node %q (see 'edgehop testbed status')", node)
	}
	return c, nil
}

// findTarget finds name among every node's containers, asking every
// agent once: a container or else the members of the group so named
// (only when every agent answered: a group is not acted on in part).
func findTarget(ctx context.Context, st *testbed.State, name string) (api.Container, []api.Container, error) {
	all, err := listAll(ctx, st)
	for _, c := range all {
		if c.Name == name {
			return c, nil, nil
		}
	}
	if members := membersOf(all, name); err == nil && len(members) > 0 {
		return api.Container{}, members, nil
	}
	if err != nil {
		return api.Container{}, nil, fmt.Errorf("container %q not found on the reachable nodes: %w", name, err)
	}
	return api.Container{}, nil, fmt.Errorf("no container %q on any node of testbed %s (see 'edgehop ps')", name, st.Name)
}

// listAll lists containers of every node; an unreachable agent is an error.
func listAll(ctx context.Context, st *testbed.State) ([]api.Container, error) {
	var mu sync.Mutex
	var all []api.Container
	var errs []error
	var wg sync.WaitGroup
	for node, c := range agents(st) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs, err := c.List(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("node %s: %w", node, err))
				return
			}
			all = append(all, cs...)
		}()
	}
	wg.Wait()
	sort.Slice(all, func(i, j int) bool { return all[i].Node+"/"+all[i].Name < all[j].Node+"/"+all[j].Name })
	return all, errors.Join(errs...)
}

func runRun(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	node := fs.String("node", "", "node to run on (see 'edgehop testbed status')")
	name := fs.String("name", "", "container name, unique in the testbed")
	img := fs.String("image", "", "image name (see 'edgehop image ls')")
	ip := fs.String("ip", "", "overlay address (default: allocated from the node's range)")
	var env multiFlag
	fs.Var(&env, "env", "environment variable KEY=VALUE (repeatable)")
	group := fs.String("group", "", "make it a member of GROUP, which migrates as one unit ('edgehop migrate GROUP --to N')")
	after := fs.String("after", "", "members of its group it depends on, comma-separated: restored before it serves")
	pod := fs.String("pod", "", "make it a member of POD, a group whose members share one network namespace and address (the first member's), on one node")
	var capAdd multiFlag
	fs.Var(&capAdd, "cap-add", "give it capability CAP_X beyond the default set, which lacks CAP_MKNOD and CAP_NET_RAW (repeatable; it keeps them when it migrates)")
	memory := fs.String("memory", "", "its memory limit, as 512m or 1.5g (default: the agent's, 2 GiB); it keeps it when it migrates")
	pids := fs.Int64("pids", 0, "the most tasks it may have (default: the agent's, 4096)")
	cpus := fs.Float64("cpus", 0, "the CPUs it may use, as 1.5 (a CFS quota; default: no quota)")
	asJSON := fs.Bool("json", false, "print the container as JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	var memBytes int64
	if *memory != "" {
		var err error
		if memBytes, err = units.ParseSize(*memory); err != nil || memBytes == 0 {
			return fmt.Errorf("%w: --memory %q: want a size such as 512m or 2g", errUsage, *memory)
		}
	}
	if *pids < 0 || *cpus < 0 {
		return fmt.Errorf("%w: --pids and --cpus must be positive", errUsage)
	}
	for _, c := range capAdd {
		if _, err := runc.ParseCapability(c); err != nil {
			return fmt.Errorf("%w: --cap-add: %v", errUsage, err)
		}
	}
	var deps []string
	if *after != "" {
		deps = strings.Split(*after, ",")
	}
	rest := fs.Args()
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if *node == "" || *name == "" || *img == "" {
		return fmt.Errorf("%w: --node, --name and --image are required", errUsage)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	if _, ok := st.Node(*node); !ok {
		var names []string
		for _, n := range st.Nodes {
			names = append(names, n.Name)
		}
		return fmt.Errorf("unknown node %q (nodes: %s)", *node, strings.Join(names, ", "))
	}
	all, err := listAll(ctx, st)
	if err != nil {
		return err
	}
	for _, c := range all {
		if c.Name == *name || c.Group == *name {
			if c.Group == *name {
				return fmt.Errorf("%q names a group (of %s on %s); pick another container name", *name, c.Name, c.Node)
			}
			return fmt.Errorf("a container named %q already runs on %s (pick another name or 'edgehop rm %s')", *name, c.Node, *name)
		}
		if g := cmp.Or(*pod, *group); g != "" && c.Name == g {
			return fmt.Errorf("group %q would share the name of container %s on %s; pick another", g, c.Name, c.Node)
		}
		if *pod != "" && c.Group == *pod && c.Node != *node {
			return fmt.Errorf("pod %s runs on %s (its members share one network namespace there): run it with --node %s", *pod, c.Node, c.Node)
		}
		if *ip != "" && c.IP == *ip {
			return fmt.Errorf("address %s is already used by %q on %s", *ip, c.Name, c.Node)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := agents(st)[*node].Run(rctx, api.RunRequest{Name: *name, Image: *img, IP: *ip, Args: rest, Env: env, Group: *group, After: deps, Pod: *pod, CapAdd: capAdd,
		Memory: memBytes, Pids: *pids, CPUs: *cpus})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(c)
	}
	fmt.Printf("%s running on %s at %s\n", c.Name, c.Node, c.IP)
	return nil
}

// formatLimits writes a container's cgroup limits: "512 MiB, 1024 pids,
// 1.5 cpus"; "-" for none.
func formatLimits(c api.Container) string {
	var parts []string
	if c.MemoryLimit > 0 {
		parts = append(parts, fmt.Sprintf("%g MiB", math.Round(float64(c.MemoryLimit)/(1<<20)*10)/10))
	}
	if c.PidsLimit > 0 {
		parts = append(parts, fmt.Sprintf("%d pids", c.PidsLimit))
	}
	if c.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("%g cpus", c.CPUs))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// podHolder reports whether c is a pod's first member, whose network
// namespace and address the others share.
func podHolder(c api.Container) bool { return c.Pod != "" && c.NetOf == "" }

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runPs(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ps", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	// Print what the reachable agents report, then fail if one was not.
	all, err := listAll(ctx, st)
	if *asJSON {
		if all == nil {
			all = []api.Container{}
		}
		if perr := printJSON(all); perr != nil {
			return perr
		}
		return err
	}
	// A group with members on two nodes runs split (a member moved
	// alone); 'migrate GROUP --to N' makes it whole.
	at := map[string]string{}
	split := map[string]bool{}
	for _, c := range all {
		if c.Group == "" {
			continue
		}
		if n, ok := at[c.Group]; ok && n != c.Node {
			split[c.Group] = true
		}
		at[c.Group] = c.Node
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tGROUP\tNODE\tIMAGE\tIP\tPORTS\tUSER\tSTATUS\tPID\tLIMITS")
	for _, c := range all {
		ports, user, group := strings.Join(c.Ports, ","), c.User, c.Group
		if ports == "" {
			ports = "-"
		}
		if group == "" {
			group = "-"
		} else if c.Pod != "" {
			group = "pod " + c.Pod
			if c.NetOf != "" {
				group += " (net of " + c.NetOf + ")"
			}
		}
		if len(c.After) > 0 {
			group += " (after " + strings.Join(c.After, ",") + ")"
		}
		if split[c.Group] {
			group += " (split)"
		}
		if user == "" {
			user = "root"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", c.Name, group, c.Node, c.Image, c.IP, ports, user, c.Status, c.PID, formatLimits(c))
	}
	if ferr := w.Flush(); ferr != nil {
		return ferr
	}
	return err
}

func runLogs(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("logs", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: edgehop logs NAME", errUsage)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	c, members, err := findTarget(ctx, st, fs.Arg(0))
	if err != nil {
		return err
	}
	if members != nil {
		// A group: each member's output under its name.
		var errs []error
		for _, m := range byDependency(members) {
			fmt.Printf("==> %s on %s <==\n", m.Name, m.Node)
			errs = append(errs, agents(st)[m.Node].Logs(ctx, m.Name, os.Stdout))
		}
		return errors.Join(errs...)
	}
	return agents(st)[c.Node].Logs(ctx, fs.Arg(0), os.Stdout)
}

func runRm(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rm", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		return fmt.Errorf("%w: edgehop rm NAME…", errUsage)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range fs.Args() {
		c, members, err := findTarget(ctx, st, name)
		switch {
		case err != nil:
		case members == nil:
			err = agents(st)[c.Node].Remove(ctx, name)
		default:
			// A group: every member, dependents first; a pod's first
			// member, which holds the others' network, last.
			ordered := byDependency(members)
			sort.SliceStable(ordered, func(i, j int) bool { return podHolder(ordered[i]) && !podHolder(ordered[j]) })
			for i := len(ordered) - 1; i >= 0; i-- {
				m := ordered[i]
				err = errors.Join(err, agents(st)[m.Node].Remove(ctx, m.Name))
			}
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

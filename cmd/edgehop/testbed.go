package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgehop/edgehop/internal/controller"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/units"
)

func init() {
	register(command{name: "testbed", summary: "emulated edge network on this machine: up | down | status | link | exec", run: runTestbed})
}

func runTestbed(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: edgehop testbed up|down|status|link|exec", errUsage)
	}
	switch args[0] {
	case "up":
		return testbedUp(ctx, args[1:])
	case "down":
		return testbedDown(ctx, args[1:])
	case "status":
		return testbedStatus(args[1:])
	case "link":
		return testbedLink(ctx, args[1:])
	case "exec":
		return testbedExec(args[1:])
	case "supervise": // internal: started by 'testbed up'
		fs := flag.NewFlagSet("testbed supervise", flag.ContinueOnError)
		procs := fs.String("procs", "", "process list written by 'testbed up'")
		if err := parse(fs, args[1:]); err != nil {
			return err
		}
		return testbed.Supervise(ctx, *procs)
	}
	return fmt.Errorf("%w: unknown testbed command %q (up|down|status|link|exec)", errUsage, args[0])
}

// linkFlags parse a link's parameters.
type linkFlags struct {
	rate, delay, jitter string
	loss                float64
}

func (l *linkFlags) register(fs *flag.FlagSet, prefix string, def testbed.Link) {
	fs.StringVar(&l.rate, prefix+"rate", units.FormatRate(def.RateBps), "link rate (e.g. 1gbit, 100mbit; 0 = unshaped)")
	fs.StringVar(&l.delay, prefix+"delay", def.Delay.String(), "one-way delay in each direction")
	fs.StringVar(&l.jitter, prefix+"jitter", def.Jitter.String(), "delay jitter (uniform, never reorders)")
	fs.Float64Var(&l.loss, prefix+"loss", def.Loss, "loss probability 0..1 in each direction")
}

func (l *linkFlags) link() (testbed.Link, error) {
	var out testbed.Link
	var err error
	if l.rate != "unlimited" && l.rate != "0" {
		if out.RateBps, err = units.ParseRate(l.rate); err != nil {
			return out, err
		}
	}
	if out.Delay, err = time.ParseDuration(l.delay); err != nil {
		return out, fmt.Errorf("delay %q: %w", l.delay, err)
	}
	if out.Jitter, err = time.ParseDuration(l.jitter); err != nil {
		return out, fmt.Errorf("jitter %q: %w", l.jitter, err)
	}
	out.Loss = l.loss
	return out, out.Validate()
}

func testbedUp(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("testbed up", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	nodes := fs.Int("nodes", 3, "number of edge nodes")
	clients := fs.Int("clients", 1, "number of mobile clients")
	images := fs.String("images", envOr("EDGEHOP_IMAGES", "/var/lib/edgehop/images"), "OCI image cache the agents import from (env EDGEHOP_IMAGES)")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	verbose := fs.Bool("v", false, "log progress")
	var nl, cl linkFlags
	nl.register(fs, "node-", testbed.DefaultNodeLink)
	cl.register(fs, "client-", testbed.DefaultClientLink)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := requireSetup(); err != nil {
		return err
	}
	nodeLink, err := nl.link()
	if err != nil {
		return fmt.Errorf("%w: node link: %v", errUsage, err)
	}
	clientLink, err := cl.link()
	if err != nil {
		return fmt.Errorf("%w: client link: %v", errUsage, err)
	}
	spec := testbed.DefaultSpec(tb.name, *nodes, *clients)
	for i := range spec.Nodes {
		spec.Nodes[i].Link = nodeLink
	}
	for i := range spec.Clients {
		spec.Clients[i].Link = clientLink
	}
	bin, err := selfBinary()
	if err != nil {
		return err
	}
	st, err := testbed.Up(ctx, spec, testbed.Options{Root: tb.root, Binary: bin, ImageRoot: *images, Log: logger(*verbose)})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(st)
	}
	printStatus(st)
	return nil
}

func testbedDown(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("testbed down", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	verbose := fs.Bool("v", false, "log progress")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := requireSetup(); err != nil {
		return err
	}
	return testbed.Down(ctx, tb.root, tb.name, logger(*verbose))
}

func testbedStatus(args []string) error {
	fs := flag.NewFlagSet("testbed status", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	st, err := testbed.Status(tb.root, tb.name)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(st)
	}
	printStatus(st)
	return nil
}

func printStatus(st *testbed.State) {
	// The header's long lines go around the table, not through it.
	fmt.Printf("testbed %s  overlay %s  gateway %s\n", st.Name, st.Overlay, st.Gateway)
	if st.Controller.URL != "" {
		fmt.Printf("controller  %s  (API; needs the token)\n", st.Controller.URL)
		if tok, err := st.Controller.Token(); err == nil {
			fmt.Printf("dashboard   %s  (login link: sets a cookie)\n", controller.LoginURL(st.Controller.URL, tok))
			fmt.Printf("token file  %s  (Authorization: Bearer <token>)\n", st.Controller.TokenFile)
		} else {
			fmt.Printf("token       %v\n", err)
		}
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ROLE\tNAME\tNETNS\tADDRESS\tRATE\tDELAY\tJITTER\tLOSS\tAGENT PID\tAP")
	row := func(role string, m testbed.Member) {
		pid := "-"
		if m.AgentPID > 0 {
			pid = strconv.Itoa(m.AgentPID)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%v\t%v\t%g\t%s\t%s\n", role, m.Name, m.NetNS, m.Address,
			units.FormatRate(m.Link.RateBps), m.Link.Delay, m.Link.Jitter, m.Link.Loss, pid, m.AP)
	}
	for _, m := range st.Nodes {
		row("node", m)
	}
	for _, m := range st.APs {
		row("ap", m)
	}
	for _, m := range st.Clients {
		row("client", m)
	}
	w.Flush()
}

func testbedLink(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("testbed link", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	rate := fs.String("rate", "", "new rate (e.g. 100mbit, 0 = unshaped)")
	delay := fs.String("delay", "", "new one-way delay")
	jitter := fs.String("jitter", "", "new jitter")
	loss := fs.Float64("loss", -1, "new loss probability")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: edgehop testbed link NODE|CLIENT [--rate R] [--delay D] [--jitter J] [--loss P]", errUsage)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	m, ok := st.Member(pos[0])
	if !ok || m.Name == "core" {
		return fmt.Errorf("unknown node or client %q (see 'edgehop testbed status')", pos[0])
	}
	l := m.Link
	if *rate != "" {
		if *rate == "0" || *rate == "unlimited" {
			l.RateBps = 0
		} else if l.RateBps, err = units.ParseRate(*rate); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	if *delay != "" {
		if l.Delay, err = time.ParseDuration(*delay); err != nil {
			return fmt.Errorf("%w: delay: %v", errUsage, err)
		}
	}
	if *jitter != "" {
		if l.Jitter, err = time.ParseDuration(*jitter); err != nil {
			return fmt.Errorf("%w: jitter: %v", errUsage, err)
		}
	}
	if *loss >= 0 {
		l.Loss = *loss
	}
	return testbed.SetLink(ctx, tb.root, tb.name, m.Name, l)
}

func testbedExec(args []string) error {
	fs := flag.NewFlagSet("testbed exec", flag.ContinueOnError)
	var tb tbFlags
	tb.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) < 2 {
		return fmt.Errorf("%w: edgehop testbed exec MEMBER -- COMMAND [ARGS]", errUsage)
	}
	st, err := tb.load()
	if err != nil {
		return err
	}
	member, cmdArgs := rest[0], rest[1:]
	if cmdArgs[0] == "--" {
		cmdArgs = cmdArgs[1:]
	}
	cmd, err := st.Exec(member, cmdArgs[0], cmdArgs[1:]...)
	if err != nil {
		return err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(cmdArgs, " "), err)
	}
	return nil
}

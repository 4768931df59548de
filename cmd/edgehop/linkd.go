package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/edgehop/edgehop/internal/linkemu"
)

// linkd is started by the testbed inside the core namespace; it is not
// meant to be run by hand.
func init() {
	register(command{name: "linkd", summary: "(internal, started by the testbed) link delay daemon for this netns", run: runLinkd})
}

// linkdFile is the --config file: {"control": PATH, "max_queue_len": N,
// "queues": [{"queue": N, "delay_us": D, "jitter_us": J, "loss": L}, …]}.
type linkdFile struct {
	Control     string              `json:"control"`
	MaxQueueLen uint32              `json:"max_queue_len"`
	Queues      []linkemu.QueueSpec `json:"queues"`
}

// queueFlags collects repeated --queue N[:delay_us[:jitter_us[:loss]]].
type queueFlags []linkemu.QueueSpec

func (q *queueFlags) String() string {
	s := make([]string, len(*q))
	for i, v := range *q {
		s[i] = fmt.Sprintf("%d:%d:%d:%g", v.Queue, v.DelayUS, v.JitterUS, v.Loss)
	}
	return strings.Join(s, " ")
}

func (q *queueFlags) Set(s string) error {
	spec, err := linkemu.ParseQueueSpec(s)
	if err != nil {
		return err
	}
	*q = append(*q, spec)
	return nil
}

func runLinkd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("linkd", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: edgehop linkd [--control SOCK] [--config FILE] [--queue N[:delay_us[:jitter_us[:loss]]]]...\n\n"+
			"Holds the packets of the given NFQUEUE queues of the current network namespace for their\n"+
			"delay (plus uniform jitter, never reordering), drops a fraction loss, until SIGTERM.\n"+
			"Change a queue at run time with a JSON line on the control socket:\n"+
			`  {"op":"set","queue":N,"delay_us":D,"jitter_us":J,"loss":L}   {"op":"status"}`+"\n")
		fs.PrintDefaults()
	}
	control := fs.String("control", "", "control unix socket `path`")
	config := fs.String("config", "", "JSON config `file` (control, max_queue_len, queues); --control and --queue override it")
	maxLen := fs.Uint("max-queue-len", 0, "packets held per queue before the kernel lets more bypass (default 65536)")
	debug := fs.Bool("debug", false, "log at debug level")
	var queues queueFlags
	fs.Var(&queues, "queue", "serve a queue; `spec` is N[:delay_us[:jitter_us[:loss]]] (repeatable)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}

	cfg := linkemu.DefaultConfig()
	if *config != "" {
		data, err := os.ReadFile(*config)
		if err != nil {
			return err
		}
		var f linkdFile
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			return fmt.Errorf("config %s: %w", *config, err)
		}
		cfg.Control = f.Control
		if f.MaxQueueLen > 0 {
			cfg.MaxQueueLen = f.MaxQueueLen
		}
		for _, q := range f.Queues {
			cfg.Queues[q.Queue] = q.Params()
		}
	}
	if *control != "" {
		cfg.Control = *control
	}
	if *maxLen > 0 {
		cfg.MaxQueueLen = uint32(min(*maxLen, 1<<31))
	}
	for _, q := range queues {
		cfg.Queues[q.Queue] = q.Params()
	}
	if cfg.Control == "" && len(cfg.Queues) == 0 {
		return fmt.Errorf("%w: nothing to do: give --control or at least one --queue", errUsage)
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	d, err := linkemu.Start(ctx, cfg)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return d.Close()
	case err := <-d.Failed():
		// A queue that stopped receiving delays nothing; exiting unbinds it
		// so --queue-bypass lets its traffic through.
		return errors.Join(err, d.Close())
	}
}

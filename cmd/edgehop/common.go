package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/edgehop/edgehop/internal/testbed"
)

// envOr returns the environment variable k or def.
func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// tbFlags are the flags every testbed-facing command shares.
type tbFlags struct {
	name string
	root string
}

func (f *tbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.name, "testbed", envOr("EDGEHOP_TESTBED", "main"), "testbed name (env EDGEHOP_TESTBED)")
	fs.StringVar(&f.root, "root", envOr("EDGEHOP_ROOT", testbed.DefaultRoot), "state root (env EDGEHOP_ROOT)")
}

func (f *tbFlags) load() (*testbed.State, error) { return testbed.Load(f.root, f.name) }

// parse parses flags, turning flag errors into usage errors.
func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stderr)
			fs.Usage()
			os.Exit(0)
		}
		return fmt.Errorf("%w: %v (see 'edgehop %s -h')", errUsage, err, fs.Name())
	}
	return nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func logger(verbose bool) *slog.Logger {
	lvl := slog.LevelWarn
	if verbose {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// requireSetup fails with one clear line when the machine lacks what
// edgehop needs, naming the missing piece and the fix.
func requireSetup() error {
	if os.Geteuid() != 0 {
		return errors.New("must run as root (namespaces, runc and CRIU need it)")
	}
	for _, t := range []string{"runc", "criu", "iptables", "nsenter"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s not found: run 'make setup' (scripts/setup.sh) first", t)
		}
	}
	return nil
}

// selfBinary is the absolute path of this executable.
func selfBinary() (string, error) {
	p, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(p)
}

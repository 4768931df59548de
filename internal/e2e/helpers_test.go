package e2e

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testbed"
	"github.com/edgehop/edgehop/internal/testutil"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error

	failpointBuildOnce sync.Once
	failpointBinPath   string
	failpointBuildErr  error
)

// binary returns the edgehop binary under test: $EDGEHOP_BIN, or one built
// once for this test process.
func binary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("EDGEHOP_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() { binPath, buildErr = buildBinaries(t, "edgehop-e2e") })
	if buildErr != nil {
		t.Fatalf("build edgehop: %v", buildErr)
	}
	return binPath
}

// failpointBinary returns the edgehop binary built with the tag
// failpoints, whose agents exit where a crash test arms a failpoint (the
// product build has none, internal/agent/failpoint.go):
// $EDGEHOP_FAILPOINT_BIN, which must exist and have the tag, or, when it
// is not set (EDGEHOP_BIN set by hand, or not at all), one built once for
// this test process.
func failpointBinary(t *testing.T) string {
	t.Helper()
	const how = "build it with `make build` (go build -tags failpoints -o bin/edgehop-failpoints ./cmd/edgehop), " +
		"or unset EDGEHOP_FAILPOINT_BIN to have the test build one"
	if p := os.Getenv("EDGEHOP_FAILPOINT_BIN"); p != "" {
		info, err := buildinfo.ReadFile(p)
		if err != nil {
			t.Fatalf("EDGEHOP_FAILPOINT_BIN=%s: %v: this test needs agents built with the tag failpoints: %s", p, err, how)
		}
		if !hasBuildTag(info, "failpoints") {
			t.Fatalf("EDGEHOP_FAILPOINT_BIN=%s was built without the tag failpoints (its agents never crash at a failpoint): %s", p, how)
		}
		return p
	}
	failpointBuildOnce.Do(func() {
		failpointBinPath, failpointBuildErr = buildBinaries(t, "edgehop-e2e-failpoints", "-tags", "failpoints")
	})
	if failpointBuildErr != nil {
		t.Fatalf("build edgehop with the tag failpoints: %v", failpointBuildErr)
	}
	return failpointBinPath
}

// hasBuildTag says whether the binary of info was built with tag.
func hasBuildTag(info *buildinfo.BuildInfo, tag string) bool {
	for _, s := range info.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), tag) {
			return true
		}
	}
	return false
}

// buildBinaries builds edgehop with the go build flags given into a new
// temporary directory named after pattern, with the criu shim and the
// probe next to it as the Makefile puts them, and returns its path.
func buildBinaries(t *testing.T, pattern string, flags ...string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "edgehop")
	args := append(append([]string{"build"}, flags...), "-o", bin, "github.com/edgehop/edgehop/cmd/edgehop")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Logf("%s", out)
		return "", err
	}
	// The criu shim agents use when it is next to their binary.
	if err := testutil.BuildCRIUShim(filepath.Join(dir, runc.ShimName)); err != nil {
		t.Logf("criu shim not built: %v", err)
	}
	probe := filepath.Join(dir, "probe")
	if out, err := exec.Command("go", "build", "-o", probe, "github.com/edgehop/edgehop/cmd/probe").CombinedOutput(); err != nil {
		t.Logf("%s", out)
		return "", err
	}
	return bin, nil
}

// env is a testbed environment for one test.
type env struct {
	t    *testing.T
	bin  string
	name string
	root string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, binary)
}

// newEnvWith is newEnv with the edgehop binary that bin returns, e.g.
// failpointBinary for the crash tests.
func newEnvWith(t *testing.T, bin func(*testing.T) string) *env {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc", "criu", "iptables", "nsenter")
	return &env{t: t, bin: bin(t), name: testutil.UniqueName("e"), root: t.TempDir()}
}

// run runs edgehop with args and returns stdout, stderr and the error.
func (e *env) run(args ...string) (string, string, error) {
	e.t.Helper()
	cmd := exec.Command(e.bin, args...)
	cmd.Env = append(os.Environ(), "EDGEHOP_TESTBED="+e.name, "EDGEHOP_ROOT="+e.root)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// must runs edgehop and fails the test on error.
func (e *env) must(args ...string) string {
	e.t.Helper()
	out, errs, err := e.run(args...)
	if err != nil {
		e.t.Fatalf("edgehop %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errs)
	}
	return out
}

func (e *env) mustJSON(v any, args ...string) {
	e.t.Helper()
	out := e.must(args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("edgehop %s: bad JSON %v:\n%s", strings.Join(args, " "), err, out)
	}
}

// up brings the testbed up and registers its teardown.
func (e *env) up(args ...string) {
	e.t.Helper()
	e.t.Cleanup(func() {
		if _, errs, err := e.run("testbed", "down"); err != nil {
			e.t.Errorf("testbed down: %v: %s", err, errs)
		}
	})
	e.failOnRaces()
	e.must(append([]string{"testbed", "up"}, args...)...)
}

// raceReport starts what the race detector writes to a process's stderr
// (an agent's: its log) when it finds a data race.
const raceReport = "WARNING: DATA RACE"

// failOnRaces has the test fail if a log of the env's testbed (agents,
// controller, link daemon, supervisor) holds a race detector report,
// which only a race-built binary writes (make race runs a few tests with
// EDGEHOP_BIN=bin/edgehop-race and GORACE=halt_on_error=1, under which
// the process exits after its first report and is restarted). Register
// it after the testbed's teardown: cleanups run last registered first, so
// it reads the logs before the teardown removes them.
func (e *env) failOnRaces() {
	e.t.Cleanup(func() {
		dir := testbed.Dir(e.root, e.name)
		var logs []string
		for _, g := range []string{"*.log", "*/*.log", "nodes/*/*.log"} {
			m, _ := filepath.Glob(filepath.Join(dir, g))
			logs = append(logs, m...)
		}
		for _, f := range logs {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if i := bytes.Index(b, []byte(raceReport)); i >= 0 {
				e.t.Errorf("%s: %d race detector report(s), the first:\n%s", strings.TrimPrefix(f, dir+"/"),
					bytes.Count(b, []byte(raceReport)), firstLines(string(b[i:]), 80))
			}
		}
	})
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// demoRun is an `edgehop demo` running on testbed e.name.
type demoRun struct {
	cmd       *exec.Cmd
	out, errb bytes.Buffer
	done      chan struct{}
	err       error
}

// startDemo starts `edgehop demo --json` with args on the env's own
// testbed (never the default "demo", which another run on this machine may
// hold). If the test ends with the demo still running (a failed check),
// the demo is stopped with SIGTERM, which tears its testbed down, and
// whatever it left is brought down.
func (e *env) startDemo(args ...string) *demoRun {
	e.t.Helper()
	d := &demoRun{done: make(chan struct{})}
	d.cmd = exec.Command(e.bin, append([]string{"demo", "--json", "--testbed", e.name, "--root", e.root}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = &d.out, &d.errb
	if err := d.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { d.err = d.cmd.Wait(); close(d.done) }()
	e.t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.done:
			case <-time.After(time.Minute):
				_ = d.cmd.Process.Kill()
				<-d.done
			}
			e.t.Logf("demo stopped at the end of the test; its stderr ends:\n%s", tail(d.errb.String(), 3000))
		}
		if m, _ := filepath.Glob(linux.NetNSPath("eh-" + e.name + "-*")); len(m) > 0 {
			if _, errs, err := e.run("testbed", "down"); err != nil {
				e.t.Errorf("testbed down: %v: %s", err, errs)
			}
		}
	})
	return d
}

// wait waits for the demo to end and returns its stdout, stderr and exit
// error.
func (d *demoRun) wait() (string, string, error) {
	<-d.done
	return d.out.String(), d.errb.String(), d.err
}

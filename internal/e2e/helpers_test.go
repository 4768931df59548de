package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary returns the edgehop binary under test: $EDGEHOP_BIN, or one built
// once for this test process.
func binary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("EDGEHOP_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "edgehop-e2e")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "edgehop")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/edgehop/edgehop/cmd/edgehop").CombinedOutput()
		if err != nil {
			buildErr = err
			t.Logf("%s", out)
			return
		}
		// The criu shim agents use when it is next to their binary.
		if err := testutil.BuildCRIUShim(filepath.Join(dir, runc.ShimName)); err != nil {
			t.Logf("criu shim not built: %v", err)
		}
		probe := filepath.Join(dir, "probe")
		if out, err := exec.Command("go", "build", "-o", probe, "github.com/edgehop/edgehop/cmd/probe").CombinedOutput(); err != nil {
			buildErr = err
			t.Logf("%s", out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build edgehop: %v", buildErr)
	}
	return binPath
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
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "runc", "criu", "iptables", "nsenter")
	e := &env{t: t, bin: binary(t), name: testutil.UniqueName("e"), root: t.TempDir()}
	return e
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
	e.must(append([]string{"testbed", "up"}, args...)...)
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

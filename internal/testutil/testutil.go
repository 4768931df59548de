package testutil

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

var seq atomic.Uint64

// RequireRoot skips the test when not running as root, saying so.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("skipped: needs root (namespaces, netlink); CI runs as root")
	}
}

// RequireTool skips the test when a command is not on PATH, naming it.
func RequireTool(tb testing.TB, names ...string) {
	tb.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			tb.Skipf("skipped: %s not installed (run 'make setup')", n)
		}
	}
}

// UniqueName returns a short name unique to this process and call, usable
// as a namespace or interface name prefix (at most 10 characters).
func UniqueName(prefix string) string {
	if len(prefix) > 4 {
		prefix = prefix[:4]
	}
	return fmt.Sprintf("%s%x%x", prefix, os.Getpid()%0xfff, seq.Add(1))
}

// NewNetNS creates a named network namespace that is deleted, together
// with every process still inside it, when the test ends. It returns the
// namespace's path.
func NewNetNS(tb testing.TB, prefix string) string {
	tb.Helper()
	RequireRoot(tb)
	path := linux.NetNSPath("ehtest-" + UniqueName(prefix))
	if err := linux.NewNetNS(path); err != nil {
		tb.Fatalf("new netns: %v", err)
	}
	tb.Cleanup(func() {
		if ino, err := linux.NetNSInode(path); err == nil {
			if pids, _ := linux.PIDsInNetNS(ino); len(pids) > 0 {
				for _, p := range pids {
					if p != os.Getpid() {
						_ = exec.Command("kill", "-9", fmt.Sprint(p)).Run()
					}
				}
			}
		}
		if err := linux.DeleteNetNS(path); err != nil {
			tb.Errorf("cleanup netns: %v", err)
		}
	})
	return path
}

// Eventually polls cond every 10 ms until it returns nil or the deadline
// passes, then fails the test with the last error.
func Eventually(tb testing.TB, timeout time.Duration, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %v: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Churn calls f(0), f(1), … on a goroutine of its own until tb ends: a
// running service changing files while the test reads them.
func Churn(tb testing.TB, f func(i int)) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f(i)
		}
	}()
	tb.Cleanup(func() { close(stop); <-done })
}

// Run runs a command and fails the test with its output on error.
func Run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RunCheckingLeaks runs m and, when its tests passed, fails unless the
// file descriptors and goroutines they opened are all gone within three
// seconds (once their cleanups ran), printing every goroutine's stack if
// not. Use it from TestMain: os.Exit(testutil.RunCheckingLeaks(m)).
func RunCheckingLeaks(m *testing.M) int {
	fds, goroutines := countFDs(), runtime.NumGoroutine()
	code := m.Run()
	if code != 0 {
		return code
	}
	// Fuzzing (-fuzz) and the testing package's signal handling leave
	// os/signal's goroutine and the coordinator's fds: leaks only in a
	// plain run.
	if fuzzing() {
		return 0
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		nfds, ngo := countFDs(), runtime.NumGoroutine()
		if nfds <= fds && ngo <= goroutines {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "leak: %d fds (was %d), %d goroutines (was %d)\n", nfds, fds, ngo, goroutines)
			buf := make([]byte, 1<<20)
			os.Stderr.Write(buf[:runtime.Stack(buf, true)])
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fuzzing reports whether the test binary runs the fuzzing engine.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	if f != nil && f.Value.String() != "" {
		return true
	}
	f = flag.Lookup("test.fuzzworker")
	return f != nil && f.Value.String() == "true"
}

func countFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// ErrNoCC is BuildCRIUShim's error when there is no C compiler.
var ErrNoCC = errors.New("no C compiler to build the criu shim (run 'make setup')")

// BuildCRIUShim compiles the criu shim (cmd/edgehop-criu) to out, and its
// gate library (runc.GateLibName) next to it, as the Makefile does.
func BuildCRIUShim(out string) error {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return ErrNoCC
	}
	_, self, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(self), "..", "..", "cmd", "edgehop-criu")
	if b, err := exec.Command(cc, "-O2", "-Wall", "-Wextra", "-static", "-o", out, filepath.Join(src, "edgehop-criu.c")).CombinedOutput(); err != nil {
		return fmt.Errorf("build the criu shim: %v: %s", err, b)
	}
	lib := filepath.Join(filepath.Dir(out), "edgehop-criu-gate.so")
	if b, err := exec.Command(cc, "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-o", lib, filepath.Join(src, "gate.c")).CombinedOutput(); err != nil {
		return fmt.Errorf("build the criu gate library: %v: %s", err, b)
	}
	return nil
}

// CPUTime is this process's user and system CPU time so far: benchmarks
// whose two ends run in the test process report what both cost.
func CPUTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

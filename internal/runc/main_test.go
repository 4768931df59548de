package runc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

// rootfs is a busybox root filesystem shared read-only by every test
// container; built once in TestMain.
var rootfs string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "edgehop-runc-rootfs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildRootfs(dir); err != nil {
		// Only tests that run containers need it; they skip when empty.
		fmt.Fprintf(os.Stderr, "no busybox rootfs: %v\n", err)
	} else {
		rootfs = dir
	}

	// Every copier goroutine and pipe must be gone once the tests' cleanups
	// have run.
	return testutil.RunCheckingLeaks(m)
}

// buildRootfs makes a minimal root filesystem: a static busybox with a
// relative symlink per applet (`busybox --install -s` would link to the
// host path), plus the directories runc mounts on, and users root and
// nobody.
func buildRootfs(dir string) error {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox not installed (run 'make setup'): %w", err)
	}
	// Its root is the containers' /: searchable by nobody too (a temp
	// dir is made 0700).
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"bin", "proc", "sys", "dev", "tmp", "etc", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "group"), []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"), 0o644)
}

// newRuntime returns a Runtime with its own runc root for this test,
// logging to the test's output. Containers still listed under the root at
// the end of the test are force-deleted, and the output copiers stopped.
func newRuntime(t *testing.T) *runc.Runtime {
	t.Helper()
	testutil.RequireRoot(t)
	if rootfs == "" {
		t.Skip("skipped: no busybox rootfs (busybox-static not installed; run 'make setup')")
	}
	r := &runc.Runtime{
		Root: filepath.Join(t.TempDir(), "runc"),
		Log:  slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if _, err := r.List(context.Background()); errors.Is(err, runc.ErrNotSupported) {
		t.Skipf("skipped: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		states, err := r.List(ctx)
		if err != nil {
			t.Errorf("cleanup: list: %v", err)
		}
		for _, s := range states {
			if err := r.Delete(ctx, s.ID, true); err != nil {
				t.Errorf("cleanup: delete %s: %v", s.ID, err)
			}
		}
		r.Close()
	})
	return r
}

// requireCRIU skips the test when CRIU cannot work here, with the reason.
func requireCRIU(t *testing.T, r *runc.Runtime) {
	t.Helper()
	if err := r.CheckCRIU(context.Background()); err != nil {
		if errors.Is(err, runc.ErrNotSupported) {
			t.Skipf("skipped: %v", err)
		}
		t.Fatal(err)
	}
}

// testSpec returns a spec for the busybox rootfs in netns with a cgroup
// path unique to this test.
func testSpec(t *testing.T, netns string, args ...string) runc.Spec {
	return runc.Spec{
		Rootfs:         rootfs,
		Args:           args,
		Hostname:       "box",
		NetNSPath:      netns,
		ReadonlyRootfs: true,
		CgroupsPath:    "/edgehop-test-" + testutil.UniqueName("cg"),
	}
}

// writeBundle writes a bundle for s into a new temp dir.
func writeBundle(t *testing.T, s runc.Spec) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := runc.WriteBundle(dir, s); err != nil {
		t.Fatal(err)
	}
	return dir
}

// syncBuffer is an io.Writer the test can read while the runtime writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ints returns the complete lines of b parsed as integers; a line that is
// not a number fails the test.
func (b *syncBuffer) ints(t *testing.T) []int {
	t.Helper()
	s := b.String()
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	} else {
		return nil
	}
	var out []int
	for _, l := range strings.Split(s, "\n") {
		n, err := strconv.Atoi(l)
		if err != nil {
			t.Fatalf("output line %q is not a number (output %q)", l, b.String())
		}
		out = append(out, n)
	}
	return out
}

// netnsOf returns the inode of a process's network namespace.
func netnsOf(t *testing.T, pid int) uint64 {
	t.Helper()
	ino, err := linux.NetNSInode(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	return ino
}

// alive reports whether pid exists (and is not a zombie).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// assertGone checks that nothing of container id is left: no runc state,
// no listing, no process in netns, no cgroup directory.
func assertGone(t *testing.T, r *runc.Runtime, id, netns, cgroupsPath string) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.State(ctx, id); !errors.Is(err, runc.ErrNotFound) {
		t.Errorf("state of %s after removal: got err %v, want ErrNotFound", id, err)
	}
	states, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.ID == id {
			t.Errorf("%s still listed: %+v", id, s)
		}
	}
	if _, err := os.Stat(filepath.Join(r.Root, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runc state dir of %s still exists (err %v)", id, err)
	}
	if netns != "" {
		ino, err := linux.NetNSInode(netns)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 5*time.Second, func() error {
			all, err := linux.PIDsInNetNS(ino)
			if err != nil {
				return err
			}
			// linux.NewNetNS may have left this process's main thread in
			// the namespace (a locked thread that cannot exit is parked).
			var pids []int
			for _, p := range all {
				if p != os.Getpid() {
					pids = append(pids, p)
				}
			}
			if len(pids) > 0 {
				return fmt.Errorf("processes %v still in %s", pids, netns)
			}
			return nil
		})
	}
	if cgroupsPath != "" {
		for _, ctl := range []string{"memory", "freezer", "pids"} {
			p := filepath.Join("/sys/fs/cgroup", ctl, cgroupsPath)
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s still exists (err %v)", p, err)
			}
		}
	}
}

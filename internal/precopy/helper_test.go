package precopy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// The helper is this test binary run again as a child that fills memory
// with a verifiable pattern and keeps rewriting a fraction of it: the
// "service" the tests copy while it runs.
//
// Page i of its buffer holds i, a version, and a body derived from i; a
// separate table holds every page's current version. Each hot page (a
// pseudo-random hot% of them) gets a new version once per cycle. On
// SIGUSR1 it checks every page against the table and writes the verdict
// to <dir>/check: a restored copy with a wrong or stale page fails.
//
// With children it first starts that many helpers of a quarter of its
// size as its own children (directories <dir>/child<k>), making a process
// tree; their pages equal the first pages of their parent's, as pages
// shared by forked workers would.
const helperEnv = "PRECOPY_TEST_HELPER" // "<MiB>,<hot %>,<cycle ms>,<children>,<dir>"

type helperSpec struct {
	mb, hotPct, cycleMs, children int
	dir                           string
}

func (h helperSpec) String() string {
	return fmt.Sprintf("%d,%d,%d,%d,%s", h.mb, h.hotPct, h.cycleMs, h.children, h.dir)
}

// childSpec is the spec of child k.
func (h helperSpec) childSpec(k int) helperSpec {
	return helperSpec{mb: max(1, h.mb/4), hotPct: h.hotPct, cycleMs: h.cycleMs, dir: filepath.Join(h.dir, fmt.Sprintf("child%d", k))}
}

// isHot selects hot pages pseudo-randomly, so changed pages are spread
// over the buffer rather than contiguous.
func isHot(i uint64, pct int) bool {
	i ^= i >> 33
	i *= 0xff51afd7ed558ccd
	i ^= i >> 33
	return int(i%100) < pct
}

// body fills p (a page minus its 16-byte header) from page index i.
func body(p []byte, i uint64) {
	x := i*0x9e3779b97f4a7c15 + 1
	for k := 0; k+8 <= len(p); k += 8 {
		x = x*6364136223846793005 + 1442695040888963407
		binary.LittleEndian.PutUint64(p[k:], x)
	}
}

func runHelper() error {
	parts := strings.SplitN(os.Getenv(helperEnv), ",", 5)
	if len(parts) != 5 {
		return fmt.Errorf("bad %s", helperEnv)
	}
	var spec helperSpec
	var err1, err2, err3, err4 error
	spec.mb, err1 = strconv.Atoi(parts[0])
	spec.hotPct, err2 = strconv.Atoi(parts[1])
	spec.cycleMs, err3 = strconv.Atoi(parts[2])
	spec.children, err4 = strconv.Atoi(parts[3])
	spec.dir = parts[4]
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	for k := 0; k < spec.children; k++ {
		cs := spec.childSpec(k)
		if err := os.Mkdir(cs.dir, 0o755); err != nil {
			return err
		}
		cmd := exec.Command("/proc/self/exe", "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+cs.String())
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return err
		}
		for {
			if _, err := os.Stat(filepath.Join(cs.dir, "ready")); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	n := uint64(spec.mb) << 20 / PageSize
	mem := make([]byte, n*PageSize)
	table := make([]uint64, n)
	var hot []uint64
	for i := uint64(0); i < n; i++ {
		p := mem[i*PageSize : (i+1)*PageSize]
		binary.LittleEndian.PutUint64(p, i)
		body(p[16:], i)
		if isHot(i, spec.hotPct) {
			hot = append(hot, i)
		}
	}
	if err := writeAtomic(filepath.Join(spec.dir, "ready"), fmt.Sprintf("%d %d\n", n, len(hot))); err != nil {
		return err
	}

	var version uint64
	write := func(i uint64) {
		version++
		binary.LittleEndian.PutUint64(mem[i*PageSize+8:], version)
		table[i] = version
	}
	verify := func() string {
		want := make([]byte, PageSize-16)
		for i := uint64(0); i < n; i++ {
			p := mem[i*PageSize : (i+1)*PageSize]
			body(want, i)
			switch {
			case binary.LittleEndian.Uint64(p) != i:
				return fmt.Sprintf("bad page %d: index %d", i, binary.LittleEndian.Uint64(p))
			case binary.LittleEndian.Uint64(p[8:]) != table[i]:
				return fmt.Sprintf("bad page %d: version %d, table says %d", i, binary.LittleEndian.Uint64(p[8:]), table[i])
			case string(p[16:]) != string(want):
				return fmt.Sprintf("bad page %d: body", i)
			}
		}
		return fmt.Sprintf("ok %d pages, version %d", n, version)
	}

	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start, done, next := time.Now(), uint64(0), 0
	for {
		select {
		case <-sig:
			if err := writeAtomic(filepath.Join(spec.dir, "check"), verify()+"\n"); err != nil {
				return err
			}
		case <-tick.C:
			if spec.cycleMs == 0 || len(hot) == 0 {
				continue
			}
			due := uint64(time.Since(start).Seconds() * 1000 / float64(spec.cycleMs) * float64(len(hot)))
			for k := 0; done < due && k < len(hot); k++ {
				write(hot[next])
				next = (next + 1) % len(hot)
				done++
			}
			done = due
		}
	}
}

func writeAtomic(path, s string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// helperProc is a running helper.
type helperProc struct {
	cmd *exec.Cmd // the helper, or unshare with the helper as its child
	pid int       // the helper, in this process's pid namespace
}

// kill stops the helper and its children and waits until they are
// reaped.
func (h *helperProc) kill() {
	killTree(h.pid, func() {
		h.cmd.Process.Kill()
		h.cmd.Wait()
	})
}

// killTree kills the process tree rooted at pid, runs waitRoot (which
// reaps the root or its parent), and reaps what is left, which this
// process (a child subreaper) inherits. Zombies inside a pid namespace
// are its init's to reap.
func killTree(pid int, waitRoot func()) {
	tree, _ := processTree(pid)
	for _, p := range tree {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
	waitRoot()
	for _, p := range tree {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			_, err := syscall.Wait4(p.pid, nil, 0, nil)
			if !errors.Is(err, syscall.ECHILD) {
				break // reaped, or not ours to reap
			}
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p.pid)); err != nil {
				break // gone: reaped by a namespace's init
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// startHelper runs the helper and waits until its memory is filled; with
// pidns it runs as the init of a new pid namespace (as in a container),
// so its namespace pid (1) differs from its pid here. It is killed when
// the test ends.
func startHelper(t testing.TB, spec helperSpec, pidns bool) *helperProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := linux.SetChildSubreaper(); err != nil {
		t.Fatal(err) // orphaned children of the helper come back here
	}
	args := []string{self, "-test.run=^$"}
	if pidns {
		// setsid inside: CRIU wants the session leader in the namespace.
		args = append([]string{"unshare", "--pid", "--fork", "setsid"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), helperEnv+"="+spec.String())
	// No stdio: CRIU restores /dev/null, not the test's pipes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: !pidns}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	h := &helperProc{cmd: cmd, pid: cmd.Process.Pid}
	t.Cleanup(h.kill)
	ready := filepath.Join(spec.dir, "ready")
	testutil.Eventually(t, 30*time.Second, func() error {
		if cmd.ProcessState != nil {
			return fmt.Errorf("helper exited")
		}
		_, err := os.Stat(ready)
		return err
	})
	if pidns {
		kids, err := linux.ChildPIDs(cmd.Process.Pid)
		if err != nil || len(kids) != 1 {
			t.Fatalf("unshare's children: %v %v", kids, err)
		}
		h.pid = kids[0]
	}
	return h
}

// xorPage returns a XOR b.
func xorPage(a, b []byte) []byte {
	x := bytes.Clone(a)
	xorInto(x, b)
	return x
}

// testHash is the page hasher of the tests' hand-made streams.
var testHash = newPageHasher()

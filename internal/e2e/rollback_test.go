package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testbed"
)

// upAPI brings a testbed up through the Go API, for options the CLI does
// not expose (fault injection); teardown is registered.
func (e *env) upAPI(spec testbed.Spec, o testbed.Options) *testbed.State {
	e.t.Helper()
	spec.Name = e.name
	o.Root, o.Binary = e.root, e.bin
	if o.ImageRoot == "" {
		o.ImageRoot = "/var/lib/edgehop/images"
	}
	e.t.Cleanup(func() {
		if err := testbed.Down(context.Background(), e.root, e.name, nil); err != nil {
			e.t.Errorf("down: %v", err)
		}
	})
	e.failOnRaces()
	st, err := testbed.Up(context.Background(), spec, o)
	if err != nil {
		e.t.Fatalf("testbed up: %v", err)
	}
	return st
}

// redisWithData runs redis on node0, fills it with n keys of size bytes
// from client0 and returns its address and an open client connection.
func (e *env) redisWithData(st *testbed.State, n, size int) (string, *redisConn) {
	e.t.Helper()
	var c ctr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "redis", "--image", "services", "--json", "--",
		"redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no")
	addr := c.IP + ":6379"
	var rc *redisConn
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		rc, err = dialRedis(st.Clients[0].NetNSPath, addr)
		if err == nil {
			if _, err = rc.do("PING"); err == nil {
				break
			}
			rc.Close()
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("redis not answering: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Cleanup(func() { rc.Close() })
	if err := rc.fill(n, size); err != nil {
		e.t.Fatalf("fill redis: %v", err)
	}
	return addr, rc
}

// requireResumedOnSource checks a failed migration left the service on
// node0, answering on the connection opened before, with every key, and
// nothing of it on node1.
func (e *env) requireResumedOnSource(st *testbed.State, rc *redisConn, n, size int, errs string, destAlive bool) {
	e.t.Helper()
	if !strings.Contains(errs, "resumed on node0") {
		e.t.Errorf("migration error does not say the service was resumed: %s", errs)
	}
	var ps []ctr
	out, _, _ := e.run("ps", "--json") // a dead destination agent makes ps fail after printing
	if err := json.Unmarshal([]byte(out), &ps); err != nil {
		e.t.Fatalf("ps --json: %v: %s", err, out)
	}
	if len(ps) != 1 || ps[0].Node != "node0" {
		e.t.Fatalf("after a failed migration ps = %+v, want redis on node0 only", ps)
	}
	if err := rc.verify(n, size); err != nil {
		e.t.Fatalf("connection or data after rollback: %v", err)
	}
	// A live destination cleans up at once (within a moment: a restore
	// called off at its gate ends with runc retrying, for ~150 ms, to
	// remove the cgroups it was started in); a killed one on its next
	// start (its leftovers are marked incoming).
	left, _ := os.ReadDir(filepath.Join(st.Nodes[1].StateDir, "containers"))
	for deadline := time.Now().Add(10 * time.Second); destAlive && len(left) != 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		left, _ = os.ReadDir(filepath.Join(st.Nodes[1].StateDir, "containers"))
	}
	if destAlive && len(left) != 0 {
		e.t.Errorf("destination kept %v 10 s after a failed migration", left)
	}
	for _, d := range left {
		b, _ := os.ReadFile(filepath.Join(st.Nodes[1].StateDir, "containers", d.Name(), "meta.json"))
		if !strings.Contains(string(b), `"incoming": true`) {
			e.t.Errorf("destination leftover %s is not marked incoming: %s", d.Name(), b)
		}
	}
	if netnsLocked(st, "node0", "redis") {
		e.t.Errorf("CRIU lock chain left in the source namespace")
	}
}

func netnsLocked(st *testbed.State, node, name string) bool {
	m, _ := st.Node(node)
	return linux.Command(filepath.Join(m.StateDir, "netns", name), "iptables", "-w", "-n", "-L", "CRIU").Run() == nil
}

// TestRollbackDestinationKilled: the destination agent dies in the middle
// of the transfer; the service resumes on the source with its data and its
// client connection.
func TestRollbackDestinationKilled(t *testing.T) {
	e := newEnv(t)
	spec := testbed.DefaultSpec(e.name, 2, 1)
	spec.Nodes[1].Link.RateBps = 100_000_000 // a slow destination: a wide window
	spec.Clients[0].Link.RateBps = 1_000_000_000
	st := e.upAPI(spec, testbed.Options{})
	const n, size = 60_000, 1000
	_, rc := e.redisWithData(st, n, size)

	type out struct {
		stdout, stderr string
		err            error
	}
	done := make(chan out, 1)
	go func() {
		// Uncompressed: the ~60 MB take seconds on the slow link, a wide
		// window to kill the destination in.
		o, errs, err := e.run("migrate", "redis", "--to", "node1", "--compress", "off")
		done <- out{o, errs, err}
	}()
	// Wait until the destination is receiving, then kill its agent.
	// (transfer.RecvDir fills a partial directory, renamed when complete:
	// redis-in's, or with the restore started on the layer, redis-in-images'.)
	in := filepath.Join(st.Nodes[1].StateDir, "scratch", ".redis-in*.partial-")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ents, _ := filepath.Glob(in + "*"); len(ents) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("destination never started receiving")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	pid, _ := os.ReadFile(filepath.Join(st.Nodes[1].StateDir, "agent.pid"))
	if out, err := exec.Command("kill", "-9", strings.TrimSpace(string(pid))).CombinedOutput(); err != nil {
		t.Fatalf("kill destination agent: %v %s", err, out)
	}
	o := <-done
	if o.err == nil {
		t.Fatalf("migration succeeded although the destination died: %s", o.stdout)
	}
	e.requireResumedOnSource(st, rc, n, size, o.stderr, false)
}

// TestRollbackRestoreFails: CRIU restore fails on the destination (a runc
// wrapper injects the failure); the service resumes on the source with its
// client's connection, under every strategy. Under post-copy and hybrid
// the source's lazy dump is serving pages when it is aborted, and CRIU
// resumes the service with its connections still in repair mode, which the
// agent must end.
func TestRollbackRestoreFails(t *testing.T) {
	for _, strategy := range []string{"stop-and-copy", "pre-copy", "post-copy", "hybrid"} {
		t.Run(strategy, func(t *testing.T) {
			e := newEnv(t)
			st, rc := e.redisWithFailingRunc("node1", "restore")
			_, errs, err := e.run("migrate", "redis", "--to", "node1", "--strategy", strategy)
			if err == nil {
				t.Fatal("migration succeeded although restore was made to fail")
			}
			if !strings.Contains(errs, "restore") {
				t.Errorf("error does not carry the restore failure: %s", errs)
			}
			e.requireResumedOnSource(st, rc, 5_000, 1000, errs, true)
		})
	}
}

// TestRollbackDumpFails: the source's checkpoint fails, in CRIU after the
// freeze (the destination took the service's traffic) or in runc before
// it; the source takes the service back and the client's connection goes
// on.
func TestRollbackDumpFails(t *testing.T) {
	for _, tc := range []struct {
		name, want string // want: the injected failure the error names
		strategy   string
		up         func(e *env) (*testbed.State, *redisConn)
	}{
		{"criu", "injected dump failure", "stop-and-copy", func(e *env) (*testbed.State, *redisConn) {
			st := e.upWithRunc(map[string]string{"node0": criuDumpWrapper(e.t, "redis", failDump("injected dump failure"))})
			_, rc := e.redisWithData(st, 5_000, 1000)
			return st, rc
		}},
		// Pre-copy's final delta sends each process's pages while CRIU
		// dumps: a process's images appear, cross, and then the dump fails.
		{"criu-after-pages", "injected dump failure", "pre-copy", func(e *env) (*testbed.State, *redisConn) {
			imgs := fakeProcessImages(e.t)
			action := "cp " + imgs + "/* \"$(dirname \"$INJECT_LOG\")/\"; " + failDump("injected dump failure")
			st := e.upWithRunc(map[string]string{"node0": criuDumpWrapper(e.t, "redis", action)})
			_, rc := e.redisWithData(st, 5_000, 1000)
			return st, rc
		}},
		{"runc", "injected checkpoint failure", "stop-and-copy", func(e *env) (*testbed.State, *redisConn) { return e.redisWithFailingRunc("node0", "checkpoint") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			st, rc := tc.up(e)
			_, errs, err := e.run("migrate", "redis", "--to", "node1", "--strategy", tc.strategy)
			if err == nil {
				t.Fatal("migration succeeded although the dump was made to fail")
			}
			if !strings.Contains(errs, tc.want) {
				t.Errorf("error does not carry the dump failure %q: %s", tc.want, errs)
			}
			e.requireResumedOnSource(st, rc, 5_000, 1000, errs, true)
		})
	}
}

// redisWithFailingRunc brings up two nodes whose node's runc fails the
// given verb, and redis on node0 holding 5000 keys of 1000 bytes.
func (e *env) redisWithFailingRunc(node, verb string) (*testbed.State, *redisConn) {
	e.t.Helper()
	realRunc, err := exec.LookPath("runc")
	if err != nil {
		e.t.Skip("skipped: runc not installed")
	}
	wrap := e.t.TempDir()
	script := "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = " + verb + " ] && { echo 'injected " + verb + " failure' >&2; exit 1; }; done\nexec " + realRunc + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(wrap, "runc"), []byte(script), 0o755); err != nil {
		e.t.Fatal(err)
	}
	st := e.upWithRunc(map[string]string{node: wrap})
	_, rc := e.redisWithData(st, 5_000, 1000)
	return st, rc
}

// TestRollbackDestinationDiskFull: the destination's image space is too
// small for the checkpoint; the migration is refused before the freeze and
// the service goes on where it was, with its connection and data.
func TestRollbackDestinationDiskFull(t *testing.T) {
	e := newEnv(t)
	spec := testbed.DefaultSpec(e.name, 2, 1)
	spec.Clients[0].Link.RateBps = 1_000_000_000
	st := e.upAPI(spec, testbed.Options{ScratchMB: map[string]int{"node1": 8}})
	const n, size = 30_000, 1000
	_, rc := e.redisWithData(st, n, size)
	_, errs, err := e.run("migrate", "redis", "--to", "node1")
	if err == nil {
		t.Fatal("migration succeeded into an 8 MB tmpfs")
	}
	// The destination sees before the freeze that the images cannot fit.
	if !strings.Contains(strings.ToLower(errs), "no space") || !strings.Contains(errs, "scratch") {
		t.Errorf("error does not name the full scratch space: %s", errs)
	}
	var ps []ctr
	e.mustJSON(&ps, "ps", "--json")
	if len(ps) != 1 || ps[0].Node != "node0" {
		t.Fatalf("after a refused migration ps = %+v, want redis on node0 only", ps)
	}
	if err := rc.verify(n, size); err != nil {
		t.Fatalf("connection or data after the refusal: %v", err)
	}
	if left, _ := os.ReadDir(filepath.Join(st.Nodes[1].StateDir, "containers")); len(left) != 0 {
		t.Errorf("destination kept %v after a refused migration", left)
	}
}

// fakeProcessImages writes, in a directory it returns, the pages image
// and pagemap CRIU would write for one process (pid 99, one page at
// 0x400000), as a dump's first images.
func fakeProcessImages(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	le := func(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }
	pm := append(le(0x54564319), le(0x56084025)...)                 // common and pagemap magics
	head := []byte{0x08, 99}                                        // pagemap_head{pages_id: 99}
	entry := []byte{0x08, 0x80, 0x80, 0x80, 0x02, 0x10, 1, 0x20, 4} // {vaddr: 0x400000, nr_pages: 1, flags: PE_PRESENT}
	pm = append(append(append(pm, le(uint32(len(head)))...), head...), append(le(uint32(len(entry))), entry...)...)
	page := bytes.Repeat([]byte{0x5a}, 4096)
	for name, b := range map[string][]byte{"pagemap-99.img": pm, "pages-99.img": page} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

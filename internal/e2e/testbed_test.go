package e2e

import (
	"bufio"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testbed"
)

type member struct {
	Name    string `json:"name"`
	NetNS   string `json:"netns"`
	Address string `json:"address"`
}

type status struct {
	Nodes   []member `json:"nodes"`
	Clients []member `json:"clients"`
}

type ctr struct {
	Name   string `json:"name"`
	Node   string `json:"node"`
	IP     string `json:"ip"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

// probeExchange dials addr from inside the namespace nsName, sends lines and
// checks each reply against the probe protocol; it returns the median RTT.
func probeExchange(t *testing.T, nsName, addr string, lines int) time.Duration {
	t.Helper()
	var conn net.Conn
	err := linux.InNetNS(linux.NetNSPath(nsName), func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, nsName, err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	var sent []byte
	var rtts []time.Duration
	for i := 0; i < lines; i++ {
		line := []byte(fmt.Sprintf("hello %d %s\n", i, strings.Repeat("x", i)))
		sent = append(sent, line...)
		start := time.Now()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(line); err != nil {
			t.Fatalf("write: %v", err)
		}
		reply, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read reply %d: %v", i, err)
		}
		rtts = append(rtts, time.Since(start))
		want := fmt.Sprintf("%d %08x\n", len(sent), crc32.ChecksumIEEE(sent))
		if reply != want {
			t.Fatalf("reply %d = %q, want %q", i, reply, want)
		}
	}
	// median
	for i := range rtts {
		for j := i + 1; j < len(rtts); j++ {
			if rtts[j] < rtts[i] {
				rtts[i], rtts[j] = rtts[j], rtts[i]
			}
		}
	}
	return rtts[len(rtts)/2]
}

// TestTestbedLifecycle is the check: up, status, a probe on every
// node reached from the client through emulated links, link changes take
// effect, rm and down leave nothing behind.
func TestTestbedLifecycle(t *testing.T) {
	e := newEnv(t)
	e.up("--nodes", "3", "--clients", "1", "--node-delay", "2ms", "--client-delay", "3ms")

	var st status
	e.mustJSON(&st, "testbed", "status", "--json")
	if len(st.Nodes) != 3 || len(st.Clients) != 1 {
		t.Fatalf("status: %d nodes, %d clients; want 3, 1", len(st.Nodes), len(st.Clients))
	}
	for _, m := range append(st.Nodes, st.Clients...) {
		if m.Name == "" || m.NetNS == "" || m.Address == "" {
			t.Fatalf("status member missing fields: %+v", m)
		}
		if _, err := os.Stat(linux.NetNSPath(m.NetNS)); err != nil {
			t.Fatalf("namespace of %s: %v", m.Name, err)
		}
	}

	// Nodes' default routes start migrations with a large window, the
	// clients' with the kernel's.
	for _, m := range append(st.Nodes, st.Clients[0]) {
		out, err := exec.Command("ip", "-n", m.NetNS, "route", "show", "default").CombinedOutput()
		if err != nil {
			t.Fatalf("routes of %s: %v %s", m.Name, err, out)
		}
		want := strings.HasPrefix(m.Name, "node")
		if got := strings.Contains(string(out), fmt.Sprintf("initcwnd %d initrwnd %d", testbed.NodeInitWindow, testbed.NodeInitWindow)); got != want {
			t.Errorf("default route of %s: %q; want initial windows set: %t", m.Name, strings.TrimSpace(string(out)), want)
		}
	}
	client := st.Clients[0].NetNS
	var ctrs []ctr
	for i, n := range st.Nodes {
		var c ctr
		e.mustJSON(&c, "run", "--node", n.Name, "--name", fmt.Sprintf("probe%d", i), "--image", "probe", "--json", "--", "7000")
		if c.Name != fmt.Sprintf("probe%d", i) || c.Node != n.Name || net.ParseIP(c.IP) == nil {
			t.Fatalf("run printed %+v", c)
		}
		ctrs = append(ctrs, c)
	}
	for _, c := range ctrs {
		rtt := probeExchange(t, client, net.JoinHostPort(c.IP, "7000"), 20)
		// client 3 ms + node 2 ms, each way: 10 ms; allow wide slack.
		if rtt < 8*time.Millisecond || rtt > 80*time.Millisecond {
			t.Errorf("RTT to %s on %s = %v, want about 10 ms", c.Name, c.Node, rtt)
		}
	}
	// A client moves: its access link's delay rises to 20 ms one way.
	e.must("testbed", "link", "--delay", "20ms", st.Clients[0].Name)
	rtt := probeExchange(t, client, net.JoinHostPort(ctrs[0].IP, "7000"), 10)
	if rtt < 40*time.Millisecond || rtt > 150*time.Millisecond {
		t.Errorf("RTT after link change = %v, want about 44 ms", rtt)
	}

	// Names are unique across the testbed.
	if _, errs, err := e.run("run", "--node", st.Nodes[1].Name, "--name", "probe0", "--image", "probe"); err == nil || !strings.Contains(errs, "already runs") {
		t.Errorf("duplicate name: err=%v stderr=%q", err, errs)
	}
	for _, c := range ctrs {
		e.must("rm", c.Name)
	}
	out := e.must("ps", "--json")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("ps after rm = %s", out)
	}

	e.must("testbed", "down")
	assertNothingLeft(t, e, st)
}

func assertNothingLeft(t *testing.T, e *env, st status) {
	t.Helper()
	left, _ := filepath.Glob(linux.NetNSPath("eh-" + e.name + "-*"))
	if len(left) > 0 {
		t.Errorf("namespaces left after down: %v", left)
	}
	if _, err := os.Stat(filepath.Join(e.root, "testbeds", e.name)); !os.IsNotExist(err) {
		t.Errorf("state dir left after down: %v", err)
	}
	if ms, _ := linux.MountsUnder(filepath.Join(e.root, "testbeds", e.name)); len(ms) > 0 {
		t.Errorf("mounts left after down: %v", ms)
	}
	// No process of ours runs with the testbed in its command line.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), filepath.Join(e.root, "testbeds", e.name)) {
			t.Errorf("process left after down: %s: %q", p, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/edgehop/*" + e.name + "*")
	if len(cg) > 0 {
		t.Errorf("cgroups left after down: %v", cg)
	}
}

// TestBadInput: each bad input ends in one clear error line and a
// non-zero exit, with nothing half-created.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	e.up("--nodes", "2", "--clients", "0")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--node", "nodeX", "--name", "a", "--image", "probe"}, "unknown node"},
		{[]string{"run", "--node", "node0", "--name", "a", "--image", "nosuchimage"}, "nosuchimage"},
		{[]string{"run", "--node", "node0", "--name", "bad/name", "--image", "probe"}, "container name"},
		{[]string{"rm", "ghost"}, "no container"},
		{[]string{"logs", "ghost"}, "no container"},
		{[]string{"run", "--name", "a", "--image", "probe"}, "required"},
		{[]string{"testbed", "up", "--nodes", "1"}, "already up"},
		{[]string{"ps", "--testbed", "nosuch"}, "not found"},
		{[]string{"nosuchcommand"}, "unknown command"},
		{[]string{"migrate", "ghost", "--to", "node1"}, "no container"},
	}
	for _, tc := range cases {
		out, errs, err := e.run(tc.args...)
		if err == nil {
			t.Errorf("edgehop %v succeeded, want an error (stdout %q)", tc.args, out)
			continue
		}
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "edgehop") {
			t.Errorf("edgehop %v: want one error line, got %q", tc.args, errs)
		}
		if tc.want != "" && !strings.Contains(errs, tc.want) {
			t.Errorf("edgehop %v: error %q does not mention %q", tc.args, errs, tc.want)
		}
		if strings.Contains(errs, "goroutine ") || strings.Contains(errs, "panic") {
			t.Errorf("edgehop %v: stack trace: %s", tc.args, errs)
		}
	}
	// A service whose process has exited is refused before anything is
	// frozen or prepared, with the reason and where to look.
	e.must("run", "--node", "node0", "--name", "dead", "--image", "probe", "--", "not-a-port")
	deadline := time.Now().Add(10 * time.Second)
	for {
		var cs []ctr
		e.mustJSON(&cs, "ps", "--json")
		if len(cs) == 1 && cs[0].Status != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe with a bad port still running: %+v", cs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "dead", "--to", "node1"}, "dead is not running on node0"},
		{[]string{"migrate", "dead", "--to", "nodeX"}, "unknown destination node"},
	} {
		_, errs, err := e.run(tc.args...)
		if err == nil || !strings.Contains(errs, tc.want) {
			t.Errorf("edgehop %v: err %v, stderr %q; want it to mention %q", tc.args, err, errs, tc.want)
		}
	}
	e.must("rm", "dead")
	// Nothing half-created on the nodes.
	ents1, _ := os.ReadDir(filepath.Join(e.root, "testbeds", e.name, "nodes", "node1", "containers"))
	if len(ents1) != 0 {
		t.Errorf("container dirs left on the destination after refused migrations: %v", ents1)
	}
	ents, _ := os.ReadDir(filepath.Join(e.root, "testbeds", e.name, "nodes", "node0", "containers"))
	if len(ents) != 0 {
		t.Errorf("container dirs left after failed runs: %v", ents)
	}
	ns, _ := os.ReadDir(filepath.Join(e.root, "testbeds", e.name, "nodes", "node0", "netns"))
	if len(ns) != 0 {
		t.Errorf("container namespaces left after failed runs: %v", ns)
	}
}

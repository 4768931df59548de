package runc_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/runc"
	"github.com/edgehop/edgehop/internal/testutil"
)

// The test network: a client namespace with a bridge holding clientAddr,
// and a server namespace plugged into the bridge by a veth whose server
// end is eth0 with serverAddr and serverMAC.
var (
	clientAddr = &net.IPNet{IP: net.IPv4(10, 77, 0, 1), Mask: net.CIDRMask(24, 32)}
	serverAddr = &net.IPNet{IP: net.IPv4(10, 77, 0, 2), Mask: net.CIDRMask(24, 32)}
	serverMAC  = net.HardwareAddr{0x02, 0x00, 0x0a, 0x4d, 0x00, 0x02}
)

const echoPort = 7000

// criuLockRules is the iptables chain CRIU uses to lock a namespace during
// a TCP dump (criu/net.c): loaded into the destination before its link
// comes up, it drops the client's retransmissions until the restore has
// recreated the sockets, and CRIU removes it when the restore finishes.
const criuLockRules = `*filter
:CRIU - [0:0]
-I INPUT -j CRIU
-I OUTPUT -j CRIU
-A CRIU -m mark --mark 0xC114 -j ACCEPT
-A CRIU -j DROP
COMMIT
`

// newClientNS makes the client namespace and its bridge.
func newClientNS(t *testing.T) string {
	t.Helper()
	ns := testutil.NewNetNS(t, "rtcc")
	h, err := linux.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := h.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(br, &netlink.Addr{IPNet: clientAddr}); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	return ns
}

// plugServer connects serverNS to the client's bridge with a veth named
// port on the bridge side and eth0 (serverAddr, serverMAC) inside serverNS.
func plugServer(t *testing.T, clientNS, serverNS, port string) {
	t.Helper()
	hc, err := linux.Handle(clientNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	hs, err := linux.Handle(serverNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	target, err := linux.OpenNetNS(serverNS)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	br, err := hc.LinkByName("br0")
	if err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index},
		PeerName:         "eth0",
		PeerHardwareAddr: serverMAC,
		PeerNamespace:    netlink.NsFd(int(target)),
	}
	if err := hc.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s: %v", port, err)
	}
	eth0, err := hs.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := hs.AddrAdd(eth0, &netlink.Addr{IPNet: serverAddr}); err != nil {
		t.Fatal(err)
	}
	for _, up := range []func() error{
		func() error { return hs.LinkSetUp(eth0) },
		func() error { return hc.LinkSetUp(veth) },
	} {
		if err := up(); err != nil {
			t.Fatal(err)
		}
	}
}

func unplugServer(t *testing.T, clientNS, port string) {
	t.Helper()
	h, err := linux.Handle(clientNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(port)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
}

// iptablesRules returns the filter rules of ns, IPv4 and IPv6.
func iptablesRules(t *testing.T, ns string) string {
	t.Helper()
	var all []string
	for _, bin := range []string{"iptables", "ip6tables"} {
		out, err := linux.Command(ns, bin, "-w", "-t", "filter", "-S").CombinedOutput()
		if err != nil {
			t.Fatalf("%s -S in %s: %v: %s", bin, ns, err, out)
		}
		all = append(all, string(out))
	}
	return strings.Join(all, "")
}

// lockDrops returns how many IPv4 packets the CRIU lock chain in ns has
// dropped.
func lockDrops(t *testing.T, ns string) int {
	t.Helper()
	out, err := linux.Command(ns, "iptables", "-w", "-t", "filter", "-L", "CRIU", "-v", "-x", "-n").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -L CRIU in %s: %v: %s", ns, err, out)
	}
	total := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "DROP" {
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			total += n
		}
	}
	return total
}

func lockNS(t *testing.T, ns string) {
	t.Helper()
	for _, bin := range []string{"iptables-restore", "ip6tables-restore"} {
		cmd := linux.Command(ns, bin, "-w", "--noflush")
		cmd.Stdin = strings.NewReader(criuLockRules)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s in %s: %v: %s", bin, ns, err, out)
		}
	}
}

// echo sends line on conn and waits for it to come back.
func echo(conn net.Conn, rd *bufio.Reader, line string, timeout time.Duration) error {
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(conn, "%s\n", line); err != nil {
		return fmt.Errorf("send %q: %w", line, err)
	}
	got, err := rd.ReadString('\n')
	if err != nil {
		return fmt.Errorf("receive %q: %w", line, err)
	}
	if got != line+"\n" {
		return fmt.Errorf("received %q, want %q", got, line+"\n")
	}
	return nil
}

// TestCheckpointRestoreTCP keeps a client's established TCP connection to
// an echo server across a checkpoint in one namespace and a restore into
// another namespace with the same address and MAC. The client sends while
// the server is away, so the connection survives only if the destination
// namespace drops (not resets) the retransmissions until the restore: the
// CRIU lock chain is loaded there before its link comes up.
func TestCheckpointRestoreTCP(t *testing.T) {
	ctx := context.Background()
	r := newRuntime(t)
	requireCRIU(t, r)
	testutil.RequireTool(t, "nsenter", "iptables", "ip6tables", "iptables-restore", "ip6tables-restore")
	clientNS := newClientNS(t)
	nsA := testutil.NewNetNS(t, "rtca")
	nsB := testutil.NewNetNS(t, "rtcb")
	plugServer(t, clientNS, nsA, "pa")

	id := testutil.UniqueName("echo")
	spec := testSpec(t, nsA, "nc", "-ll", "-p", fmt.Sprint(echoPort), "-e", "cat")
	var out syncBuffer
	if _, err := r.Run(ctx, id, writeBundle(t, spec), runc.IO{Stdout: &out, Stderr: &out}); err != nil {
		t.Fatal(err)
	}

	var conn net.Conn
	testutil.Eventually(t, 10*time.Second, func() error {
		return linux.InNetNS(clientNS, func() (err error) {
			conn, err = net.DialTimeout("tcp", net.JoinHostPort(serverAddr.IP.String(), fmt.Sprint(echoPort)), time.Second)
			return err
		})
	})
	t.Cleanup(func() { conn.Close() })
	rd := bufio.NewReader(conn)
	if err := echo(conn, rd, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}

	// Without TCPEstablished CRIU refuses the established socket: the
	// error must say so, and the server must keep serving.
	err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: filepath.Join(t.TempDir(), "refused")})
	var re *runc.Error
	if !errors.As(err, &re) || !strings.Contains(re.CRIUReason, "tcp-established") {
		t.Fatalf("checkpoint without TCPEstablished: got %v, want CRIU's reason naming --tcp-established", err)
	}
	t.Logf("refused checkpoint: %v", err)
	if rules := iptablesRules(t, nsA); strings.Contains(rules, "CRIU") {
		t.Logf("failed dump left CRIU's lock chain in the source namespace:\n%s", rules)
	}
	if err := echo(conn, rd, "still", 5*time.Second); err != nil {
		t.Fatalf("after the refused checkpoint: %v", err)
	}

	images := filepath.Join(t.TempDir(), "images")
	start := time.Now()
	if err := r.Checkpoint(ctx, id, runc.CheckpointOpts{ImagePath: images, TCPEstablished: true}); err != nil {
		t.Fatal(err)
	}
	dumpWall := time.Since(start)
	assertGone(t, r, id, nsA, spec.CgroupsPath)
	if rules := iptablesRules(t, nsA); !strings.Contains(rules, "-j CRIU") {
		t.Logf("source namespace not left locked after the dump:\n%s", rules)
	}

	// Move the server's network identity: the old port goes, the new
	// namespace is locked, then linked with the same address and MAC.
	unplugServer(t, clientNS, "pa")
	lockNS(t, nsB)
	plugServer(t, clientNS, nsB, "pb")

	// Sent while nothing serves it: retransmitted into the locked nsB.
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "during\n"); err != nil {
		t.Fatal(err)
	}
	// Restore only once the data has reached nsB and been dropped there
	// (without the lock it would have been answered with a reset).
	testutil.Eventually(t, 10*time.Second, func() error {
		if n := lockDrops(t, nsB); n == 0 {
			return fmt.Errorf("no packet dropped by the CRIU lock in %s yet", nsB)
		}
		return nil
	})

	specB := spec
	specB.NetNSPath = nsB
	specB.CgroupsPath = "/edgehop-test-" + testutil.UniqueName("cg")
	start = time.Now()
	pid, err := r.Restore(ctx, id, writeBundle(t, specB), runc.RestoreOpts{ImagePath: images, TCPEstablished: true},
		runc.IO{Stdout: &out, Stderr: &out})
	restoreWall := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	want, err := linux.NetNSInode(nsB)
	if err != nil {
		t.Fatal(err)
	}
	if got := netnsOf(t, pid); got != want {
		t.Errorf("restored server in netns inode %d, want %d", got, want)
	}

	got, err := rd.ReadString('\n')
	if err != nil || got != "during\n" {
		t.Fatalf("line sent during migration: got %q, %v", got, err)
	}
	if err := echo(conn, rd, "after", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rules := iptablesRules(t, nsB); strings.Contains(rules, "CRIU") {
		t.Errorf("CRIU lock chain left in the destination after restore:\n%s", rules)
	}
	t.Logf("tcp migration: checkpoint %v, restore %v", dumpWall, restoreWall)
}

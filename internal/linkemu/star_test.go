package linkemu_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/edgehop/edgehop/internal/linkemu"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// star is the testbed's topology in miniature: namespaces a and b, each
// joined by one veth pair (the link) to a core namespace that routes
// between them. The core-side ends are ifA and ifB, the far ends ul0.
type star struct {
	a, core, b   string // namespace paths
	ifA, ifB     string // core-side interfaces
	addrA, addrB string // addresses of a and b
}

// Queue numbers of the two links, as a testbed would assign them.
const (
	qUpA, qDownA uint16 = 0, 1
	qUpB, qDownB uint16 = 2, 3
)

const farIf = "ul0"

func newStar(t testing.TB) *star {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables", "iptables-restore", "nsenter")
	s := &star{
		a:     testutil.NewNetNS(t, "lka"),
		core:  testutil.NewNetNS(t, "lkc"),
		b:     testutil.NewNetNS(t, "lkb"),
		ifA:   testutil.UniqueName("lka"),
		ifB:   testutil.UniqueName("lkb"),
		addrA: "10.200.1.2",
		addrB: "10.200.2.2",
	}
	ch, err := linux.Handle(s.core)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, l := range []struct{ ns, ifName, subnet string }{{s.a, s.ifA, "10.200.1"}, {s.b, s.ifB, "10.200.2"}} {
		far, err := linux.OpenNetNS(l.ns)
		if err != nil {
			t.Fatal(err)
		}
		err = ch.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.ifName}, PeerName: farIf, PeerNamespace: netlink.NsFd(far)})
		far.Close()
		if err != nil {
			t.Fatalf("veth %s: %v", l.ifName, err)
		}
		setUpAddr(t, ch, l.ifName, l.subnet+".1/24")
		fh, err := linux.Handle(l.ns)
		if err != nil {
			t.Fatal(err)
		}
		setUpAddr(t, fh, farIf, l.subnet+".2/24")
		gw := net.ParseIP(l.subnet + ".1")
		if err := fh.RouteAdd(&netlink.Route{Gw: gw}); err != nil {
			t.Fatalf("default route: %v", err)
		}
		fh.Close()
	}
	err = linux.InNetNS(s.core, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		t.Fatalf("ip_forward: %v", err)
	}
	return s
}

// bigTCPBuffers lets TCP windows in a and b grow to 64 MiB (the default
// 6 MiB receive buffer caps a 40 ms RTT path near 600 Mbit/s).
func (s *star) bigTCPBuffers(t testing.TB) {
	t.Helper()
	for _, ns := range []string{s.a, s.b} {
		err := linux.InNetNS(ns, func() error {
			for _, f := range []string{"tcp_rmem", "tcp_wmem"} {
				if err := os.WriteFile("/proc/sys/net/ipv4/"+f, []byte("4096 131072 67108864"), 0o644); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("tcp buffers: %v", err)
		}
	}
}

func setUpAddr(t testing.TB, h *netlink.Handle, ifName, cidr string) {
	t.Helper()
	l, err := h.LinkByName(ifName)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("addr %s on %s: %v", cidr, ifName, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
}

// installRules sends both links' traffic to their queues.
func (s *star) installRules(t testing.TB) {
	t.Helper()
	if err := linkemu.InstallLink(s.core, s.ifA, qUpA, qDownA); err != nil {
		t.Fatal(err)
	}
	if err := linkemu.InstallLink(s.core, s.ifB, qUpB, qDownB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := linkemu.RemoveAllLinks(s.core); err != nil {
			t.Errorf("remove rules: %v", err)
		}
	})
}

// startDaemon runs a daemon serving the four queues in the core, in this
// process, stopped at cleanup. It returns the daemon and its socket.
func (s *star) startDaemon(t testing.TB, queues map[uint16]linkemu.Params) (*linkemu.Daemon, string) {
	t.Helper()
	cfg := linkemu.DefaultConfig()
	cfg.NetNS = s.core
	cfg.Control = filepath.Join(t.TempDir(), "linkd.sock")
	cfg.Queues = map[uint16]linkemu.Params{qUpA: {}, qDownA: {}, qUpB: {}, qDownB: {}}
	for q, p := range queues {
		cfg.Queues[q] = p
	}
	d, err := linkemu.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close daemon: %v", err)
		}
	})
	return d, cfg.Control
}

// shape sets the rate of link A in both directions.
func (s *star) shapeA(t testing.TB, rate uint64) {
	t.Helper()
	for _, e := range []struct{ ns, ifName string }{{s.core, s.ifA}, {s.a, farIf}} {
		h, err := linux.Handle(e.ns)
		if err != nil {
			t.Fatal(err)
		}
		err = linkemu.Shape(h, e.ifName, rate)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// measure measures a→b.
func (s *star) measure(t testing.TB, pings int, bulk time.Duration) linkemu.Measurement {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := linkemu.Measure(ctx, linkemu.MeasureConfig{FromNS: s.a, ToNS: s.b, ToAddr: s.addrB, Pings: pings, Duration: bulk})
	if err != nil {
		t.Fatalf("measure: %v", err)
	}
	return m
}

func fmtM(m linkemu.Measurement) string {
	return fmt.Sprintf("rtt min/median/p99/max %v/%v/%v/%v over %d, throughput %.1f Mbit/s (avg %.1f)",
		m.RTTMin.Round(10*time.Microsecond), m.RTTMedian.Round(10*time.Microsecond), m.RTTP99.Round(10*time.Microsecond),
		m.RTTMax.Round(10*time.Microsecond), m.Pings, m.Throughput/1e6, m.AvgThroughput/1e6)
}

// daemonProcess is a daemon running as its own process in the core, as
// `edgehop linkd` does: the test binary re-executed in helper mode.
type daemonProcess struct {
	sock   string
	cmd    *exec.Cmd
	exited chan error // receives the Wait result once
	stderr *strings.Builder
	waited bool
}

// startDaemonProcess starts a daemon process in the core, binds the four
// queues with the given parameters, and kills it at cleanup.
func (s *star) startDaemonProcess(t testing.TB, queues map[uint16]linkemu.Params) *daemonProcess {
	t.Helper()
	p := &daemonProcess{sock: filepath.Join(t.TempDir(), "linkd.sock"), exited: make(chan error, 1), stderr: &strings.Builder{}}
	// nsenter execs the helper: the process started is the daemon itself.
	p.cmd = linux.Command(s.core, os.Args[0], "-test.run=^$")
	p.cmd.Env = append(os.Environ(), helperEnv+"="+p.sock)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if !p.waited {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	ctx := context.Background()
	testutil.Eventually(t, 10*time.Second, func() error {
		select {
		case err := <-p.exited:
			p.waited = true
			t.Fatalf("helper daemon exited: %v: %s", err, p.stderr.String())
		default:
		}
		_, err := linkemu.Status(ctx, p.sock)
		return err
	})
	for _, q := range []uint16{qUpA, qDownA, qUpB, qDownB} {
		if err := linkemu.SetParams(ctx, p.sock, q, queues[q]); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// kill kills the daemon with SIGKILL and waits for it.
func (p *daemonProcess) kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	p.waited = true
}

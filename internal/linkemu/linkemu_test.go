package linkemu_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linkemu"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// helperEnv makes the test binary run a daemon instead of the tests (for
// TestDaemonKilled, which needs a process it can kill).
const helperEnv = "LINKEMU_TEST_DAEMON_SOCK"

func TestMain(m *testing.M) {
	if sock := os.Getenv(helperEnv); sock != "" {
		os.Exit(runHelperDaemon(sock))
	}
	os.Exit(m.Run())
}

func runHelperDaemon(sock string) int {
	cfg := linkemu.DefaultConfig()
	cfg.Control = sock
	d, err := linkemu.Start(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = d
	select {} // until killed
}

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// TestDelay checks the RTT a→b→a for delays set on the queues: with both
// links delayed d one way, a round trip crosses four queues.
func TestDelay(t *testing.T) {
	s := newStar(t)
	s.installRules(t)
	_, sock := s.startDaemon(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		queues   map[uint16]linkemu.Params
		min, max time.Duration
	}{
		{"none", nil, 0, ms(3)},
		{"10ms-both-links", map[uint16]linkemu.Params{qUpA: {Delay: ms(10)}, qDownA: {Delay: ms(10)}, qUpB: {Delay: ms(10)}, qDownB: {Delay: ms(10)}}, ms(30), ms(80)},
		{"5ms-up-only", map[uint16]linkemu.Params{qUpA: {Delay: ms(5)}}, ms(4), ms(12)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, q := range []uint16{qUpA, qDownA, qUpB, qDownB} {
				if err := linkemu.SetParams(ctx, sock, q, tc.queues[q]); err != nil {
					t.Fatal(err)
				}
			}
			m := s.measure(t, 20, -1)
			t.Logf("%s: %s", tc.name, fmtM(m))
			if m.RTTMedian < tc.min || m.RTTMedian > tc.max {
				t.Errorf("median RTT %v, want within [%v, %v]", m.RTTMedian, tc.min, tc.max)
			}
		})
	}
}

// TestNoDaemonRTT checks the baseline: the links without rules or daemon.
func TestNoDaemonRTT(t *testing.T) {
	s := newStar(t)
	m := s.measure(t, 20, -1)
	t.Logf("%s", fmtM(m))
	if m.RTTMedian > ms(3) {
		t.Errorf("median RTT %v without emulation, want < 3ms", m.RTTMedian)
	}
}

// TestRuntimeChange changes a queue's delay through the control socket
// while a connection runs, without restarting anything.
func TestRuntimeChange(t *testing.T) {
	s := newStar(t)
	s.installRules(t)
	_, sock := s.startDaemon(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		delay    time.Duration
		min, max time.Duration
	}{
		{0, 0, ms(3)},
		{ms(20), ms(20), ms(30)},
		{ms(5), ms(5), ms(10)},
		{0, 0, ms(3)},
	} {
		if err := linkemu.SetParams(ctx, sock, qDownB, linkemu.Params{Delay: tc.delay}); err != nil {
			t.Fatal(err)
		}
		m := s.measure(t, 10, -1)
		t.Logf("down B delay %v: %s", tc.delay, fmtM(m))
		if m.RTTMedian < tc.min || m.RTTMedian > tc.max {
			t.Errorf("delay %v: median RTT %v, want within [%v, %v]", tc.delay, m.RTTMedian, tc.min, tc.max)
		}
	}
	st, err := linkemu.Status(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 4 || st[qDownB].Queue != qDownB || st[qDownB].Packets == 0 || st[qDownB].Held != 0 {
		t.Errorf("status after the runs: %+v", st)
	}
}

// TestRate checks tbf shaping alone and combined with delay.
func TestRate(t *testing.T) {
	s := newStar(t)
	s.installRules(t)
	_, sock := s.startDaemon(t, nil)
	s.shapeA(t, 100_000_000)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		delay    time.Duration // on each queue of link A
		min, max float64       // Mbit/s
	}{
		{"100M", 0, 60, 110},
		{"100M-5ms", ms(5), 60, 110},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, q := range []uint16{qUpA, qDownA} {
				if err := linkemu.SetParams(ctx, sock, q, linkemu.Params{Delay: tc.delay}); err != nil {
					t.Fatal(err)
				}
			}
			m := s.measure(t, 5, 2*time.Second)
			t.Logf("%s: %s", tc.name, fmtM(m))
			if m.Mbps() < tc.min || m.Mbps() > tc.max {
				t.Errorf("throughput %.1f Mbit/s, want within [%v, %v]", m.Mbps(), tc.min, tc.max)
			}
		})
	}
	// Rate 0 removes the shaping on both ends.
	s.shapeA(t, 0)
	for _, ns := range []struct{ ns, ifName string }{{s.core, s.ifA}, {s.a, farIf}} {
		h, err := linux.Handle(ns.ns)
		if err != nil {
			t.Fatal(err)
		}
		r, err := linkemu.ShapedRate(h, ns.ifName)
		h.Close()
		if err != nil || r != 0 {
			t.Errorf("%s after rate 0: rate %d, err %v", ns.ifName, r, err)
		}
	}
}

// TestShapeInPlace checks that Shape changes an existing tbf and reads back.
func TestShapeInPlace(t *testing.T) {
	s := newStar(t)
	h, err := linux.Handle(s.core)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, rate := range []uint64{1_000_000_000, 100_000_000, 10_000_000, 40_000_000_000, 0, 5_000_000} {
		if err := linkemu.Shape(h, s.ifA, rate); err != nil {
			t.Fatalf("rate %d: %v", rate, err)
		}
		got, err := linkemu.ShapedRate(h, s.ifA)
		if err != nil || got != rate {
			t.Errorf("after Shape(%d): ShapedRate %d, %v", rate, got, err)
		}
	}
	for _, rate := range []uint64{1000, 2 * linkemu.MaxRate} {
		if err := linkemu.Shape(h, s.ifA, rate); !errors.Is(err, linkemu.ErrBadRate) {
			t.Errorf("Shape %d bit/s: err %v, want ErrBadRate", rate, err)
		}
	}
}

// TestLoss sends UDP datagrams a→b with loss on A's up queue.
func TestLoss(t *testing.T) {
	s := newStar(t)
	s.installRules(t)
	_, sock := s.startDaemon(t, nil)
	ctx := context.Background()
	const n = 2000
	for _, tc := range []struct {
		loss     float64
		min, max int
	}{
		{0, n * 98 / 100, n},
		{0.5, n * 40 / 100, n * 60 / 100},
		{1, 0, 0},
	} {
		if err := linkemu.SetParams(ctx, sock, qUpA, linkemu.Params{Loss: tc.loss}); err != nil {
			t.Fatal(err)
		}
		got := udpFlood(t, s, n)
		t.Logf("loss %v: %d of %d datagrams arrived", tc.loss, got, n)
		if got < tc.min || got > tc.max {
			t.Errorf("loss %v: %d of %d arrived, want within [%d, %d]", tc.loss, got, n, tc.min, tc.max)
		}
	}
	st, err := linkemu.Status(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	if st[qUpA].Dropped < n || st[qUpA].Dropped > n+n*60/100 {
		t.Errorf("queue %d dropped %d, want about %d", qUpA, st[qUpA].Dropped, n+n/2)
	}
}

// udpFlood sends n datagrams from a to b and returns how many arrived.
func udpFlood(t *testing.T, s *star, n int) int {
	t.Helper()
	var rc *net.UDPConn
	err := linux.InNetNS(s.b, func() (err error) {
		rc, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(s.addrB)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	_ = rc.SetReadBuffer(4 << 20)
	var sc *net.UDPConn
	err = linux.InNetNS(s.a, func() (err error) {
		sc, err = net.DialUDP("udp", nil, rc.LocalAddr().(*net.UDPAddr))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	got := make(chan int)
	go func() {
		buf := make([]byte, 2048)
		k := 0
		for {
			_ = rc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := rc.Read(buf); err != nil {
				got <- k
				return
			}
			k++
		}
	}()
	msg := make([]byte, 100)
	for i := range n {
		if _, err := sc.Write(msg); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if i%100 == 99 {
			time.Sleep(time.Millisecond) // stay below socket buffers
		}
	}
	return <-got
}

// TestJitterKeepsOrder sends numbered datagrams through a queue with jitter
// larger than their spacing: they arrive delayed but in order.
func TestJitterKeepsOrder(t *testing.T) {
	s := newStar(t)
	s.installRules(t)
	_, sock := s.startDaemon(t, map[uint16]linkemu.Params{qUpA: {Delay: ms(10), Jitter: ms(8)}})
	_ = sock
	m := s.measure(t, 30, -1)
	t.Logf("delay 10ms jitter 8ms one queue: %s", fmtM(m))
	// Delays are uniform over [2ms, 18ms]: nothing below 2ms, the median
	// near 10ms, and a clear spread (the upper end is left open: a loaded
	// machine adds latency).
	if m.RTTMin < ms(2) || m.RTTMedian < ms(5) || m.RTTMedian > ms(17) || m.RTTMax-m.RTTMin < ms(3) {
		t.Errorf("RTT min %v median %v max %v: want min ≥ 2ms, median in [5ms, 17ms], spread ≥ 3ms", m.RTTMin, m.RTTMedian, m.RTTMax)
	}
	var rc *net.UDPConn
	err := linux.InNetNS(s.b, func() (err error) {
		rc, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(s.addrB)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var sc *net.UDPConn
	err = linux.InNetNS(s.a, func() (err error) {
		sc, err = net.DialUDP("udp", nil, rc.LocalAddr().(*net.UDPAddr))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	const n = 200
	for i := range n {
		if _, err := sc.Write([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	buf := make([]byte, 16)
	for i := range n {
		_ = rc.SetReadDeadline(time.Now().Add(2 * time.Second))
		k, err := rc.Read(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if k != 1 || buf[0] != byte(i) {
			t.Fatalf("datagram %d arrived as %d: reordered", i, buf[0])
		}
	}
}

// TestDaemonKilled kills a daemon process that holds packets: traffic
// keeps flowing unshaped (--queue-bypass).
func TestDaemonKilled(t *testing.T) {
	s := newStar(t)
	s.installRules(t)
	s.shapeA(t, 500_000_000) // keeps the bulk transfer light on the shared CPUs
	p := s.startDaemonProcess(t, nil)
	sock := p.sock
	ctx := context.Background()
	for _, q := range []uint16{qUpA, qDownA, qUpB, qDownB} {
		if err := linkemu.SetParams(ctx, sock, q, linkemu.Params{Delay: ms(5)}); err != nil {
			t.Fatal(err)
		}
	}
	m := s.measure(t, 10, -1)
	t.Logf("with the daemon: %s", fmtM(m))
	if m.RTTMedian < ms(20) {
		t.Fatalf("median RTT %v with 4×5ms delay: daemon not delaying", m.RTTMedian)
	}
	// Kill it (nsenter execs the helper, so this is the daemon itself)
	// while a bulk transfer keeps packets held.
	type result struct {
		m   linkemu.Measurement
		err error
	}
	done := make(chan result, 1)
	go func() {
		mctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		m, err := linkemu.Measure(mctx, linkemu.MeasureConfig{FromNS: s.a, ToNS: s.b, ToAddr: s.addrB, Pings: 1, Duration: 2 * time.Second})
		done <- result{m, err}
	}()
	testutil.Eventually(t, 5*time.Second, func() error { // the transfer runs through the daemon
		st, err := linkemu.Status(ctx, sock)
		if err != nil {
			return err
		}
		if st[qUpA].Held == 0 || st[qUpA].Packets < 200 {
			return fmt.Errorf("up queue %+v: transfer not under way", st[qUpA])
		}
		return nil
	})
	p.kill(t)
	r := <-done
	if r.err != nil {
		t.Fatalf("bulk transfer across the kill: %v", r.err)
	}
	t.Logf("bulk transfer across the kill: %s", fmtM(r.m))
	if r.m.Bytes == 0 {
		t.Errorf("bulk transfer across the kill moved nothing")
	}
	m = s.measure(t, 10, -1)
	t.Logf("after the kill: %s", fmtM(m))
	if m.RTTMedian > ms(3) {
		t.Errorf("median RTT %v after the daemon died, want unshaped (< 3ms)", m.RTTMedian)
	}
}

// TestRules installs, replaces and removes link rules and checks what
// iptables holds after each step.
func TestRules(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables", "iptables-restore", "nsenter")
	ns := testutil.NewNetNS(t, "lkr")
	steps := []struct {
		name string
		do   func() error
		want []linkemu.LinkQueues
	}{
		{"install node0", func() error { return linkemu.InstallLink(ns, "node0", 0, 1) }, []linkemu.LinkQueues{{Interface: "node0", Up: 0, Down: 1}}},
		{"install client0", func() error { return linkemu.InstallLink(ns, "client0", 4, 5) }, []linkemu.LinkQueues{{Interface: "node0", Up: 0, Down: 1}, {Interface: "client0", Up: 4, Down: 5}}},
		{"reinstall node0", func() error { return linkemu.InstallLink(ns, "node0", 7, 8) }, []linkemu.LinkQueues{{Interface: "client0", Up: 4, Down: 5}, {Interface: "node0", Up: 7, Down: 8}}},
		{"remove client0", func() error { return linkemu.RemoveLink(ns, "client0") }, []linkemu.LinkQueues{{Interface: "node0", Up: 7, Down: 8}}},
		{"remove absent", func() error { return linkemu.RemoveLink(ns, "nosuch") }, []linkemu.LinkQueues{{Interface: "node0", Up: 7, Down: 8}}},
		{"install a client by its addresses", func() error { return linkemu.InstallPrefix(ns, "172.31.3.0/24", 10, 11) },
			[]linkemu.LinkQueues{{Interface: "node0", Up: 7, Down: 8}, {Prefix: "172.31.3.0/24", Up: 10, Down: 11}}},
		{"reinstall it", func() error { return linkemu.InstallPrefix(ns, "172.31.3.0/24", 12, 13) },
			[]linkemu.LinkQueues{{Interface: "node0", Up: 7, Down: 8}, {Prefix: "172.31.3.0/24", Up: 12, Down: 13}}},
		{"remove all", func() error { return linkemu.RemoveAllLinks(ns) }, nil},
		{"remove all again", func() error { return linkemu.RemoveAllLinks(ns) }, nil},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, err := linkemu.ListLinks(ns)
		if err != nil {
			t.Fatalf("%s: list: %v", st.name, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(st.want) {
			t.Errorf("%s: links %v, want %v", st.name, got, st.want)
		}
		out, err := linux.Command(ns, "iptables", "-t", "mangle", "-S").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables -S: %v: %s", err, out)
		}
		jumps := strings.Count(string(out), "-j "+linkemu.ChainUp) + strings.Count(string(out), "-j "+linkemu.ChainDown)
		if st.want != nil && jumps != 2 {
			t.Errorf("%s: %d jumps to our chains, want 2:\n%s", st.name, jumps, out)
		}
		if st.want == nil && strings.Contains(string(out), "EDGEHOP") {
			t.Errorf("%s: rules left behind:\n%s", st.name, out)
		}
	}
}

// TestDaemonShutdown checks that closing a daemon that holds packets
// releases them (the transfer goes on) and leaves no goroutine behind.
func TestDaemonShutdown(t *testing.T) {
	s := newStar(t)
	s.installRules(t)
	before := runtime.NumGoroutine()
	cfg := linkemu.DefaultConfig()
	cfg.NetNS = s.core
	cfg.Control = t.TempDir() + "/linkd.sock"
	cfg.Queues = map[uint16]linkemu.Params{qUpA: {Delay: ms(200)}}
	d, err := linkemu.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A datagram held for 200 ms arrives right after Close, not dropped.
	var rc *net.UDPConn
	err = linux.InNetNS(s.b, func() (err error) {
		rc, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(s.addrB)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var sc *net.UDPConn
	err = linux.InNetNS(s.a, func() (err error) {
		sc, err = net.DialUDP("udp", nil, rc.LocalAddr().(*net.UDPAddr))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, func() error {
		if st := d.Status(); len(st) != 1 || st[0].Held != 1 {
			return fmt.Errorf("status %+v, want one held packet", st)
		}
		return nil
	})
	t0 := time.Now()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	_ = rc.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 16)
	if _, err := rc.Read(buf); err != nil {
		t.Fatalf("held datagram not delivered at shutdown: %v", err)
	}
	if e := time.Since(t0); e > ms(150) {
		t.Errorf("held datagram arrived %v after Close: it waited for its delay", e)
	}
	if _, err := os.Stat(cfg.Control); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket left behind: %v", err)
	}
	if err := d.SetParams(qUpA, linkemu.Params{}); !errors.Is(err, linkemu.ErrClosed) {
		t.Errorf("SetParams after Close: %v, want ErrClosed", err)
	}
	testutil.Eventually(t, 2*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before {
			return fmt.Errorf("%d goroutines, %d before the daemon", n, before)
		}
		return nil
	})
}

// TestControl exercises the control socket: binding a queue at run time,
// errors reported by the daemon, stale and busy socket paths.
func TestControl(t *testing.T) {
	ns := testutil.NewNetNS(t, "lkctl")
	sock := t.TempDir() + "/linkd.sock"
	// A stale socket left by a dead daemon is replaced.
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	cfg := linkemu.DefaultConfig()
	cfg.NetNS, cfg.Control = ns, sock
	d, err := linkemu.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start over a stale socket: %v", err)
	}
	defer d.Close()
	if _, err := linkemu.Start(context.Background(), cfg); err == nil {
		t.Fatal("a second daemon started on a socket in use")
	}
	ctx := context.Background()
	want := linkemu.Params{Delay: ms(7), Jitter: ms(1), Loss: 0.25}
	if err := linkemu.SetParams(ctx, sock, 42, want); err != nil {
		t.Fatalf("set a new queue: %v", err)
	}
	st, err := linkemu.Status(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Queue != 42 || st[0].Params() != want {
		t.Errorf("status %+v, want queue 42 with %v", st, want)
	}
	// The daemon validates too (a client that skipped validation).
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(c, `{"queue":42,"loss":2}`)
	buf := make([]byte, 512)
	n, _ := c.Read(buf)
	c.Close()
	if !strings.Contains(string(buf[:n]), `"ok":false`) || !strings.Contains(string(buf[:n]), "loss") {
		t.Errorf("bad loss accepted: %s", buf[:n])
	}
	if err := linkemu.SetParams(ctx, sock, 1, linkemu.Params{Loss: 2}); !errors.Is(err, linkemu.ErrInvalidParams) {
		t.Errorf("client-side validation: %v", err)
	}
	if _, err := linkemu.Status(ctx, t.TempDir()+"/none.sock"); err == nil {
		t.Error("status from a missing socket succeeded")
	}
}

package netplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
	"github.com/vishvananda/netlink"
)

// pinBed is a node namespace with a bridge, one container attached to it
// and an "overlay" port whose far end, in another namespace, sends frames
// with the container's MAC as source, as a migration's source node does
// over VXLAN while the destination holds the service's traffic.
type pinBed struct {
	plane     *Plane
	container string
	mac       net.HardwareAddr
	ctrNS     string
	remoteNS  string
	overlay   string // the overlay port's name in the node namespace
}

func newPinBed(t *testing.T) *pinBed {
	t.Helper()
	testutil.RequireRoot(t)
	node := testutil.NewNetNS(t, "pinn")
	b := &pinBed{ctrNS: testutil.NewNetNS(t, "pinc"), remoteNS: testutil.NewNetNS(t, "pinr"),
		container: testutil.UniqueName("pin"), overlay: "ov" + testutil.UniqueName("p")}
	p, err := Open(node, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	b.plane = p
	if err := p.h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName}}); err != nil {
		t.Fatalf("bridge: %v", err)
	}
	br, err := p.h.LinkByName(BridgeName)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.h.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParsePrefix("10.231.0.2/24")
	b.mac = MACFor(addr.Addr())
	if err := p.Attach(Endpoint{Container: b.container, NetNSPath: b.ctrNS, Addr: addr, Gateway: netip.MustParseAddr("10.231.0.1")}, false); err != nil {
		t.Fatal(err)
	}
	remote, err := linux.OpenNetNS(b.remoteNS)
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: b.overlay, MasterIndex: br.Attrs().Index},
		PeerName: "ov", PeerHardwareAddr: b.mac, PeerNamespace: netlink.NsFd(int(remote))}
	if err := p.h.LinkAdd(veth); err != nil {
		t.Fatalf("overlay port: %v", err)
	}
	ov, err := p.h.LinkByName(b.overlay)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.h.LinkSetUp(ov); err != nil {
		t.Fatal(err)
	}
	rh, err := linux.Handle(b.remoteNS)
	if err != nil {
		t.Fatal(err)
	}
	defer rh.Close()
	rl, err := rh.LinkByName("ov")
	if err != nil {
		t.Fatal(err)
	}
	if err := rh.AddrAdd(rl, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 231, 0, 3), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := rh.LinkSetUp(rl); err != nil {
		t.Fatal(err)
	}
	return b
}

// udpIn opens a UDP socket bound to port inside the namespace at ns.
func udpIn(t *testing.T, ns string, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := linux.InNetNS(ns, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	})
	if err != nil {
		t.Fatalf("udp socket in %s: %v", ns, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestPinLocalSurvivesFramesFromTheOverlay: a frame carrying the service's
// MAC that arrives on another bridge port moves a plain static entry there
// (the bridge would then drop the service's traffic), but not a pinned one.
func TestPinLocalSurvivesFramesFromTheOverlay(t *testing.T) {
	staticEntry := func(p *Plane, mac net.HardwareAddr, container string) error {
		l, err := p.h.LinkByName(HostIfName(container))
		if err != nil {
			return err
		}
		br, err := p.h.LinkByName(BridgeName)
		if err != nil {
			return err
		}
		return p.h.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, MasterIndex: br.Attrs().Index, Family: syscall.AF_BRIDGE,
			State: netlink.NUD_NOARP, Flags: netlink.NTF_MASTER, HardwareAddr: mac})
	}
	for _, tc := range []struct {
		name      string
		pin       func(p *Plane, mac net.HardwareAddr, container string) error
		wantMoved bool
	}{
		{"static entry roams", staticEntry, true},
		{"pinned entry stays", (*Plane).PinLocal, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newPinBed(t)
			const port = 9
			sink := udpIn(t, b.ctrNS, port)
			src := udpIn(t, b.remoteNS, 0)
			if err := tc.pin(b.plane, b.mac, b.container); err != nil {
				t.Fatal(err)
			}
			home := HostIfName(b.container)
			if got, _, ok, err := bridgePort(b.plane, b.mac); err != nil || !ok || got != home {
				t.Fatalf("after pinning: port %q ok=%v err=%v, want %s", got, ok, err, home)
			}
			// Broadcasts from the overlay side carry the service's MAC as
			// source; the container receiving one proves they crossed the
			// bridge.
			bcast := &net.UDPAddr{IP: net.IPv4(10, 231, 0, 255), Port: port}
			buf := make([]byte, 64)
			testutil.Eventually(t, 5*time.Second, func() error {
				if _, err := src.WriteToUDP([]byte("from the source node"), bcast); err != nil {
					return err
				}
				_ = sink.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				_, _, err := sink.ReadFromUDP(buf)
				return err
			})
			got, sticky, ok, err := bridgePort(b.plane, b.mac)
			if err != nil || !ok {
				t.Fatalf("entry: ok=%v err=%v", ok, err)
			}
			if moved := got != home; moved != tc.wantMoved {
				t.Fatalf("entry on %s (sticky %v) after a frame from %s; moved=%v, want %v", got, sticky, b.overlay, moved, tc.wantMoved)
			}
		})
	}
}

// TestPinLocalErrors: pinning needs the container's veth and the bridge.
func TestPinLocalErrors(t *testing.T) {
	testutil.RequireRoot(t)
	p, err := Open(testutil.NewNetNS(t, "pine"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.PinLocal(MACFor(netip.MustParseAddr("10.231.0.9")), "absent")
	var nf netlink.LinkNotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("PinLocal without a veth: %v, want a link-not-found error", err)
	}
	if _, _, _, err := bridgePort(p, MACFor(netip.MustParseAddr("10.231.0.9"))); !errors.As(err, &nf) {
		t.Fatalf("bridgePort without a bridge: %v, want a link-not-found error", err)
	}
}

// bridgePort is the name of the bridge port that mac is forwarded to, and
// whether the entry is sticky; ok is false when the bridge has no entry.
func bridgePort(p *Plane, mac net.HardwareAddr) (port string, sticky, ok bool, err error) {
	br, err := p.h.LinkByName(BridgeName)
	if err != nil {
		return "", false, false, fmt.Errorf("bridge: %w", err)
	}
	neighs, err := p.h.NeighList(0, syscall.AF_BRIDGE)
	if err != nil {
		return "", false, false, fmt.Errorf("bridge fdb: %w", err)
	}
	for _, n := range neighs {
		if n.HardwareAddr.String() != mac.String() || n.MasterIndex != br.Attrs().Index {
			continue
		}
		l, err := p.h.LinkByIndex(n.LinkIndex)
		if err != nil {
			return "", false, false, fmt.Errorf("port of %v: %w", mac, err)
		}
		return l.Attrs().Name, n.Flags&netlink.NTF_STICKY != 0, true, nil
	}
	return "", false, false, nil
}

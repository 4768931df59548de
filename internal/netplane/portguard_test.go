package netplane

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/vishvananda/netlink"
)

// TestPortGuard: a container's frames cross the bridge from its own MAC
// and address only; one that takes another address or MAC (CAP_NET_RAW
// or NET_ADMIN would let it) is dropped at its port; the guard goes with
// the port.
func TestPortGuard(t *testing.T) {
	b := newPinBed(t)
	if ok, rules := b.plane.PortGuarded(b.container); !ok || !strings.Contains(rules, b.mac.String()) {
		t.Fatalf("after Attach: guarded=%v, rules %q", ok, rules)
	}
	const port = 9
	sink := udpIn(t, b.remoteNS, port)
	bcast := &net.UDPAddr{IP: net.IPv4(10, 231, 0, 255), Port: port}
	// sendFrom sends broadcasts from the container bound to src and says
	// whether the far side of the bridge got one.
	sendFrom := func(src net.IP) bool {
		t.Helper()
		var c *net.UDPConn
		if err := linux.InNetNS(b.ctrNS, func() (err error) {
			c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: src})
			return err
		}); err != nil {
			t.Fatalf("socket on %v: %v", src, err)
		}
		defer c.Close()
		buf := make([]byte, 64)
		for i := 0; i < 10; i++ {
			if _, err := c.WriteToUDP([]byte("hello"), bcast); err != nil {
				t.Fatalf("send from %v: %v", src, err)
			}
			_ = sink.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, from, err := sink.ReadFromUDP(buf); err == nil && from.IP.Equal(src) {
				return true
			}
		}
		return false
	}
	if !sendFrom(net.IPv4(10, 231, 0, 2)) {
		t.Fatal("the container's own address does not cross the bridge")
	}
	ch, err := linux.Handle(b.ctrNS)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	eth0, err := ch.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	// Another address on its own MAC.
	if err := ch.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 231, 0, 9), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if sendFrom(net.IPv4(10, 231, 0, 9)) {
		t.Error("a spoofed source address crossed the bridge")
	}
	// Its own address from another MAC.
	if err := ch.LinkSetHardwareAddr(eth0, net.HardwareAddr{0x0a, 0x58, 0x0a, 0xe7, 0x00, 0x01}); err != nil {
		t.Fatal(err)
	}
	if sendFrom(net.IPv4(10, 231, 0, 2)) {
		t.Error("a spoofed source MAC crossed the bridge")
	}
	if err := b.plane.Detach(b.container); err != nil {
		t.Fatal(err)
	}
	if ok, rules := b.plane.PortGuarded(b.container); ok {
		t.Errorf("the guard outlived its port: %q", rules)
	}
}

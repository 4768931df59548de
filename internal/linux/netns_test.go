package linux

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// A new namespace's loopback is up and keeps ::1, and a link made in it
// later comes up without IPv6: no link-local address, so nothing that
// would send neighbour discovery from a service's MAC.
func TestNewNetNSNoIPv6OnLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("kernel without IPv6: nothing to check")
	}
	path := filepath.Join(t.TempDir(), "ns")
	if err := NewNetNS(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DeleteNetNS(path) })
	h, err := Handle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1"}); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	peer, err := h.LinkByName("eth1")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []netlink.Link{peer, l} { // up with carrier: addrconf runs
		if err := h.LinkSetUp(x); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if addrs, err := h.AddrList(l, netlink.FAMILY_V6); err != nil || len(addrs) != 0 {
		t.Fatalf("eth0 has IPv6 addresses %v (%v)", addrs, err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if addrs, err := h.AddrList(lo, netlink.FAMILY_V6); err != nil || len(addrs) != 1 {
		t.Fatalf("lo's IPv6 addresses %v (%v), want ::1", addrs, err)
	}
	if lo.Attrs().Flags&0x1 == 0 { // net.FlagUp
		t.Fatal("lo is down")
	}
}

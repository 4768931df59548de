package testbed

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/vishvananda/netlink"
)

// UnderlayMTU leaves room for VXLAN's 50 bytes so the overlay keeps 1500.
const UnderlayMTU = 1550

// FarIfName is the name of a node's or client's end of its link.
const FarIfName = "ul0"

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// setupCore turns on forwarding and gives the core its VTEP address.
func setupCore(coreNS string) error {
	if err := linux.InNetNS(coreNS, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("ip_forward: %w", err)
	}
	h, err := linux.Handle(coreNS)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	return h.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(CoreVTEP, 32)})
}

// tuneNetNS raises the TCP buffer limits inside a namespace so that one
// connection can fill a long, fat emulated link (a new namespace gets
// 4 MiB, about 14 MB/s at 300 ms RTT).
func tuneNetNS(ns string) error {
	return linux.InNetNS(ns, func() error {
		for k, v := range map[string]string{
			"/proc/sys/net/ipv4/tcp_rmem": "4096 131072 83886080",
			"/proc/sys/net/ipv4/tcp_wmem": "4096 16384 83886080",
		} {
			if err := os.WriteFile(k, []byte(v), 0o644); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return nil
	})
}

// wireLink creates the veth pair between the core (end named name) and the
// far namespace (end named ul0), addresses both ends on a /24 and routes the
// far side's default through the core.
func wireLink(coreNS, farNS, name string, coreAddr, farAddr netip.Addr) error {
	ch, err := linux.Handle(coreNS)
	if err != nil {
		return err
	}
	defer ch.Close()
	fh, err := linux.Handle(farNS)
	if err != nil {
		return err
	}
	defer fh.Close()
	far, err := linux.OpenNetNS(farNS)
	if err != nil {
		return err
	}
	defer far.Close()

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: UnderlayMTU, TxQLen: 1000},
		PeerName:      FarIfName,
		PeerNamespace: netlink.NsFd(int(far)),
	}
	if err := ch.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	cl, err := ch.LinkByName(name)
	if err != nil {
		return err
	}
	if err := ch.AddrAdd(cl, &netlink.Addr{IPNet: ipNet(coreAddr, 24)}); err != nil {
		return fmt.Errorf("core addr: %w", err)
	}
	if err := ch.LinkSetUp(cl); err != nil {
		return err
	}
	fl, err := fh.LinkByName(FarIfName)
	if err != nil {
		return err
	}
	if err := fh.LinkSetMTU(fl, UnderlayMTU); err != nil {
		return err
	}
	if err := fh.AddrAdd(fl, &netlink.Addr{IPNet: ipNet(farAddr, 24)}); err != nil {
		return fmt.Errorf("far addr: %w", err)
	}
	if err := fh.LinkSetUp(fl); err != nil {
		return err
	}
	if err := fh.RouteAdd(&netlink.Route{LinkIndex: fl.Attrs().Index, Gw: coreAddr.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return tuneNetNS(farNS)
}

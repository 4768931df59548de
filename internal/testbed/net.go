package testbed

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/netplane"
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

// guardRules keep clients and containers away from the agents' and the
// controller's ports and from the overlay's tunnel: whatever arrives at the
// core from a client's link (or an access point's) or from the overlay
// (br0, the gateway's bridge) towards those ports is refused with a reset,
// and VXLAN towards any VTEP is dropped (a VTEP takes frames from any
// sender, so one would put forged frames, with any service's address, on
// a node's bridge), on the core itself (INPUT) and on its way to a node
// (FORWARD). Nodes reach each other and the core through their own links,
// which the rules do not match; the core's own VXLAN leaves from itself.
func guardRules(agentPorts string) string {
	var b strings.Builder
	b.WriteString("*filter\n:EDGEHOP-GUARD - [0:0]\n-I INPUT -j EDGEHOP-GUARD\n-I FORWARD -j EDGEHOP-GUARD\n")
	for _, in := range []string{"client+", "ap+", "br0"} {
		fmt.Fprintf(&b, "-A EDGEHOP-GUARD -i %s -p tcp -m multiport --dports %s -j REJECT --reject-with tcp-reset\n", in, agentPorts)
		fmt.Fprintf(&b, "-A EDGEHOP-GUARD -i %s -p udp --dport %d -j DROP\n", in, netplane.VXLANPort)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// guardCore installs guardRules in the core.
func guardCore(coreNS string) error {
	ports := fmt.Sprintf("%d,%d,%d", AgentPort, MigratePort, ControllerAgentPort)
	cmd := linux.Command(coreNS, "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(guardRules(ports))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("guard agent ports: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
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

// NodeInitWindow is the initial congestion and receive window, in
// segments, of a node's default route (the kernel's default is 10): the
// images a migration sends in its frozen window, about 100 KB for a small
// service, then cross a node link in one round trip instead of four of
// slow start. docs/real-hosts.md gives the same route setting for edge
// nodes.
const NodeInitWindow = 100

// wireLink creates the veth pair between the core (end named name) and the
// far namespace (end named ul0), addresses both ends on a /24 and routes the
// far side's default through the core, with initial windows of initWindow
// segments (0: the kernel's).
func wireLink(coreNS, farNS, name string, coreAddr, farAddr netip.Addr, initWindow int) error {
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
	if err := fh.RouteAdd(&netlink.Route{LinkIndex: fl.Attrs().Index, Gw: coreAddr.AsSlice(), InitCwnd: initWindow, InitRwnd: initWindow}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return tuneNetNS(farNS)
}

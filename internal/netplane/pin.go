package netplane

import (
	"fmt"
	"net"
	"syscall"

	"github.com/vishvananda/netlink"
)

// PinLocal pins mac to the container's node-side veth in the bridge's
// forwarding table with a static, sticky entry; the entry goes away with
// the veth (Detach).
//
// Sticky is what makes the pin hold. The bridge moves even a static entry
// to whichever port last received a frame with that source address, and
// frames with a migrating service's address keep arriving from the
// overlay while the destination takes its traffic: the source still runs
// until CRIU freezes it, and a node floods over VXLAN whatever has no
// FDB entry of its own (broadcasts, and unicast to the gateway's MAC).
// One such frame re-points a plain static entry at vx0, after which the
// bridge drops every packet for the service (it never sends a frame back
// out of the port it came in on) before the Holder sees it, until the
// restored service sends a frame itself; the client then waits for its
// next, backed-off retransmission. A sticky entry never moves.
func (p *Plane) PinLocal(mac net.HardwareAddr, container string) error {
	l, err := p.h.LinkByName(HostIfName(container))
	if err != nil {
		return fmt.Errorf("veth of %s: %w", container, err)
	}
	br, err := p.h.LinkByName(BridgeName)
	if err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	n := &netlink.Neigh{LinkIndex: l.Attrs().Index, MasterIndex: br.Attrs().Index, Family: syscall.AF_BRIDGE,
		State: netlink.NUD_NOARP, Flags: netlink.NTF_MASTER | netlink.NTF_STICKY, HardwareAddr: mac}
	if err := p.h.NeighSet(n); err != nil {
		return fmt.Errorf("pin %v to %s: %w", mac, container, err)
	}
	return nil
}

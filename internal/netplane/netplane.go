package netplane

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/vishvananda/netlink"
)

// Device names inside a node namespace.
const (
	BridgeName = "br0"
	VXLANName  = "vx0"
	VXLANPort  = 4789
	OverlayMTU = 1500
)

// Config describes a node's overlay.
type Config struct {
	VNI     int
	VTEP    netip.Addr   // local underlay address
	Gateway netip.Prefix // set on the bridge only on the gateway (access point); invalid otherwise
}

// Plane manipulates the overlay of one namespace. Safe for concurrent use
// (netlink requests are independent), but callers serialise changes to the
// same container.
type Plane struct {
	h   *netlink.Handle
	ns  string // the namespace's path ("": the caller's)
	cfg Config
}

// Open returns a Plane acting in the namespace at nsPath ("" = the
// caller's own namespace).
func Open(nsPath string, cfg Config) (*Plane, error) {
	var h *netlink.Handle
	var err error
	if nsPath == "" {
		h, err = netlink.NewHandle()
	} else {
		h, err = linux.Handle(nsPath)
	}
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &Plane{h: h, ns: nsPath, cfg: cfg}, nil
}

// Close releases the netlink handle.
func (p *Plane) Close() { p.h.Close() }

// Setup creates (or adopts) the bridge and the VXLAN device with learning
// off, attached to the bridge, and brings both up; it removes the port
// guards of veths that went while no agent ran (SweepGuards).
func (p *Plane) Setup() error {
	br, err := p.h.LinkByName(BridgeName)
	if err != nil {
		b := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: BridgeName, MTU: OverlayMTU}}
		if p.cfg.Gateway.IsValid() {
			b.HardwareAddr = GatewayMAC(p.cfg.Gateway.Addr())
		}
		if err := p.h.LinkAdd(b); err != nil {
			return fmt.Errorf("add bridge: %w", err)
		}
		if br, err = p.h.LinkByName(BridgeName); err != nil {
			return err
		}
	}
	vx, err := p.h.LinkByName(VXLANName)
	if err != nil {
		v := &netlink.Vxlan{
			LinkAttrs: netlink.LinkAttrs{Name: VXLANName, MTU: OverlayMTU, MasterIndex: br.Attrs().Index},
			VxlanId:   p.cfg.VNI,
			SrcAddr:   p.cfg.VTEP.AsSlice(),
			Port:      VXLANPort,
			Learning:  false,
		}
		if err := p.h.LinkAdd(v); err != nil {
			return fmt.Errorf("add vxlan: %w", err)
		}
		if vx, err = p.h.LinkByName(VXLANName); err != nil {
			return err
		}
	}
	if err := p.h.LinkSetMaster(vx, br); err != nil {
		return fmt.Errorf("attach vxlan: %w", err)
	}
	if p.cfg.Gateway.IsValid() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.cfg.Gateway.Addr().AsSlice(), Mask: net.CIDRMask(p.cfg.Gateway.Bits(), 32)}}
		if err := p.h.AddrReplace(br, a); err != nil {
			return fmt.Errorf("gateway address: %w", err)
		}
	}
	for _, l := range []netlink.Link{br, vx} {
		if err := p.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("up %s: %w", l.Attrs().Name, err)
		}
	}
	return p.SweepGuards()
}

var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

func (p *Plane) vxIndex() (int, error) {
	vx, err := p.h.LinkByName(VXLANName)
	if err != nil {
		return 0, fmt.Errorf("vxlan device: %w", err)
	}
	return vx.Attrs().Index, nil
}

// AddFlood lets broadcast and unknown traffic (ARP) reach vtep.
func (p *Plane) AddFlood(vtep netip.Addr) error {
	idx, err := p.vxIndex()
	if err != nil {
		return err
	}
	n := &netlink.Neigh{LinkIndex: idx, Family: syscall.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: vtep.AsSlice(), HardwareAddr: zeroMAC}
	if err := p.h.NeighAppend(n); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("flood entry %v: %w", vtep, err)
	}
	return nil
}

// SetRemote points mac at the remote vtep in the VXLAN FDB (replacing any
// earlier location), so unicast goes straight to the node hosting it.
func (p *Plane) SetRemote(mac net.HardwareAddr, vtep netip.Addr) error {
	idx, err := p.vxIndex()
	if err != nil {
		return err
	}
	n := &netlink.Neigh{LinkIndex: idx, Family: syscall.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: vtep.AsSlice(), HardwareAddr: mac}
	// A MAC has one location: drop stale entries first.
	_ = p.DelRemote(mac)
	if err := p.h.NeighSet(n); err != nil {
		return fmt.Errorf("fdb %v -> %v: %w", mac, vtep, err)
	}
	return nil
}

// DelRemote removes every VXLAN FDB entry for mac; missing is not an error.
func (p *Plane) DelRemote(mac net.HardwareAddr) error {
	idx, err := p.vxIndex()
	if err != nil {
		return err
	}
	neighs, err := p.h.NeighList(idx, syscall.AF_BRIDGE)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range neighs {
		if n.HardwareAddr.String() == mac.String() && n.Flags&netlink.NTF_SELF != 0 {
			n.Flags = netlink.NTF_SELF
			if err := p.h.NeighDel(&n); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Remotes lists the VXLAN FDB's unicast entries as mac -> vtep.
func (p *Plane) Remotes() (map[string]netip.Addr, error) {
	idx, err := p.vxIndex()
	if err != nil {
		return nil, err
	}
	neighs, err := p.h.NeighList(idx, syscall.AF_BRIDGE)
	if err != nil {
		return nil, err
	}
	out := map[string]netip.Addr{}
	for _, n := range neighs {
		if n.HardwareAddr.String() == zeroMAC.String() || n.IP == nil {
			continue
		}
		if a, ok := netip.AddrFromSlice(n.IP.To4()); ok {
			out[n.HardwareAddr.String()] = a
		}
	}
	return out, nil
}

// MACFor derives a container's stable, locally administered MAC from its
// overlay IP, so the same service keeps the same MAC on every node.
func MACFor(ip netip.Addr) net.HardwareAddr {
	b := ip.As4()
	return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
}

// HostIfName is the node-side veth name of a container (≤ 15 bytes).
func HostIfName(container string) string {
	sum := sha256.Sum256([]byte(container))
	return "eh" + hex.EncodeToString(sum[:])[:10]
}

// Endpoint is a container's attachment to the overlay.
type Endpoint struct {
	Container string
	NetNSPath string       // the container's namespace
	Addr      netip.Prefix // overlay address with the overlay's prefix length
	Gateway   netip.Addr
}

// Attach creates the container's veth (eth0 inside its namespace, with the
// MAC derived from its address), addresses it, routes its default through
// the gateway and plugs the node side into the bridge. If down is true the
// container side is left down (a migration destination brings it up after
// restore).
func (p *Plane) Attach(ep Endpoint, down bool) error {
	ns, err := linux.OpenNetNS(ep.NetNSPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	br, err := p.h.LinkByName(BridgeName)
	if err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	host := HostIfName(ep.Container)
	mac := MACFor(ep.Addr.Addr())
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: host, MTU: OverlayMTU, MasterIndex: br.Attrs().Index},
		PeerName:         "eth0",
		PeerHardwareAddr: mac,
		PeerNamespace:    netlink.NsFd(int(ns)),
	}
	if err := p.h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", host, err)
	}
	hl, err := p.h.LinkByName(host)
	if err != nil {
		return err
	}
	if err := p.GuardPort(ep.Container, mac, ep.Addr.Addr()); err != nil {
		return err
	}
	if err := p.h.LinkSetUp(hl); err != nil {
		return err
	}
	ch, err := linux.Handle(ep.NetNSPath)
	if err != nil {
		return err
	}
	defer ch.Close()
	cl, err := ch.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := ch.LinkSetMTU(cl, OverlayMTU); err != nil {
		return err
	}
	if err := ch.AddrAdd(cl, &netlink.Addr{IPNet: &net.IPNet{IP: ep.Addr.Addr().AsSlice(), Mask: net.CIDRMask(ep.Addr.Bits(), 32)}}); err != nil {
		return fmt.Errorf("container address: %w", err)
	}
	if down {
		return nil
	}
	return BringUp(ep)
}

// BringUp sets the container's eth0 up and installs its default route.
func BringUp(ep Endpoint) error {
	ch, err := linux.Handle(ep.NetNSPath)
	if err != nil {
		return err
	}
	defer ch.Close()
	cl, err := ch.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := ch.LinkSetUp(cl); err != nil {
		return err
	}
	// A permanent neighbour entry for the gateway: no ARP round trip is
	// needed after a migration.
	gn := &netlink.Neigh{LinkIndex: cl.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: ep.Gateway.AsSlice(), HardwareAddr: GatewayMAC(ep.Gateway)}
	if err := ch.NeighSet(gn); err != nil {
		return fmt.Errorf("gateway neighbour: %w", err)
	}
	r := &netlink.Route{LinkIndex: cl.Attrs().Index, Gw: ep.Gateway.AsSlice()}
	if err := ch.RouteReplace(r); err != nil {
		return fmt.Errorf("container default route: %w", err)
	}
	return nil
}

// Detach removes the container's node-side veth (its peer goes with it)
// and its port guard. A missing veth is not an error.
func (p *Plane) Detach(container string) error {
	if err := p.UnguardPort(container); err != nil {
		return err
	}
	l, err := p.h.LinkByName(HostIfName(container))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return p.h.LinkDel(l)
}

// SetHostLink sets the container's node-side veth up or down. Down, it is
// the source's network lock during a dump (CRIU runs with its own lock
// skipped): nothing reaches the frozen sockets, and nothing they or the
// kernel emit for them (a reset once the dumped tasks are gone) leaves
// the namespace. The namespace keeps its address and routes, so a
// service restored there again (rollback) needs only the link back up.
func (p *Plane) SetHostLink(container string, up bool) error {
	l, err := p.h.LinkByName(HostIfName(container))
	if err != nil {
		return fmt.Errorf("veth of %s: %w", container, err)
	}
	if up {
		err = p.h.LinkSetUp(l)
	} else {
		err = p.h.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("set veth of %s up=%v: %w", container, up, err)
	}
	return nil
}

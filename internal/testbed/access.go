package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/edgehop/edgehop/internal/linkemu"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/vishvananda/netlink"
)

// Access points. Each AP is a namespace on a link to the core (ap<k> in
// the core, up0 in the AP, 172.28.k.0/24). A client's link, with APs,
// runs from the client's ul0 (172.31.k.2) to vap<k> (172.31.k.1, the
// client's virtual AP) in the namespace of the AP it is attached to; the
// core routes 172.31.k.0/24 to that AP. A handoff moves vap<k> into
// another AP's namespace — the client keeps its address, its gateway's
// address and MAC, and its open connections — and points the core's route
// there. The client's emulated link (delay, loss: linkd queues matched by
// its addresses; rate: tbf on both ends) goes with it.

// vapName is the AP-side end of client k's link.
func vapName(k int) string { return fmt.Sprintf("vap%d", k) }

// apUplink is the AP-side end of an AP's link to the core.
const apUplink = "up0"

// APIndex returns the index of the AP called name.
func (st *State) APIndex(name string) (int, bool) {
	for i, a := range st.APs {
		if a.Name == name {
			return i, true
		}
	}
	return -1, false
}

// setupAPs creates the AP namespaces and their links to the core.
func setupAPs(st *State, spec Spec) error {
	for i, e := range spec.APs {
		m := Member{Name: e.Name, Index: i, NetNS: nsName(spec.Name, e.Name), Address: APAddr(i).String(), Link: e.Link}
		m.NetNSPath = linux.NetNSPath(m.NetNS)
		if err := linux.NewNetNS(m.NetNSPath); err != nil {
			return err
		}
		if err := wireLinkNamed(st.Core.NetNSPath, m.NetNSPath, e.Name, apUplink, APCoreAddr(i), APAddr(i)); err != nil {
			return fmt.Errorf("link %s: %w", e.Name, err)
		}
		if err := linux.InNetNS(m.NetNSPath, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
		}); err != nil {
			return fmt.Errorf("%s ip_forward: %w", e.Name, err)
		}
		st.APs = append(st.APs, m)
	}
	return nil
}

// attachClient wires client k (its namespace exists) to AP ap.
func attachClient(st *State, k, ap int) error {
	c, a := st.Clients[k], st.APs[ap]
	if err := wireLinkNamed(a.NetNSPath, c.NetNSPath, vapName(k), FarIfName, ClientCoreAddr(k), ClientAddr(k)); err != nil {
		return err
	}
	if err := routeClient(st, k, ap); err != nil {
		return err
	}
	st.Clients[k].AP = a.Name
	return nil
}

// routeClient points the core's route to client k's network at AP ap.
func routeClient(st *State, k, ap int) error {
	h, err := linux.Handle(st.Core.NetNSPath)
	if err != nil {
		return err
	}
	defer h.Close()
	p := ClientPrefix(k)
	if err := h.RouteReplace(&netlink.Route{Dst: ipNet(p.Addr(), p.Bits()), Gw: APAddr(ap).AsSlice()}); err != nil {
		return fmt.Errorf("route %s via %s: %w", p, st.APs[ap].Name, err)
	}
	return nil
}

// Handoff moves client's virtual AP to the access point to and returns
// how long the client's link was down. It is the testbed's tier-1
// actuator (the controller decides).
func Handoff(ctx context.Context, root, name, client, to string) (time.Duration, error) {
	var took time.Duration
	err := withLock(Dir(root, name), func() error {
		st, err := Load(root, name)
		if err != nil {
			return err
		}
		k := -1
		for i, c := range st.Clients {
			if c.Name == client {
				k = i
			}
		}
		if k < 0 {
			return fmt.Errorf("unknown client %q (see 'edgehop testbed status')", client)
		}
		from, ok := st.APIndex(st.Clients[k].AP)
		if !ok {
			return fmt.Errorf("client %s is not on an access point (testbed without APs)", client)
		}
		dst, ok := st.APIndex(to)
		if !ok {
			return fmt.Errorf("unknown access point %q", to)
		}
		if from == dst {
			return nil
		}
		t0 := time.Now()
		if err := moveVAP(st, k, from, dst); err != nil {
			return err
		}
		took = time.Since(t0)
		st.Clients[k].AP = st.APs[dst].Name
		return st.save()
	})
	return took, err
}

// moveVAP moves vap<k> from AP from to AP to and brings it up there with
// its address and rate, then reroutes the core.
func moveVAP(st *State, k, from, to int) error {
	src, err := linux.Handle(st.APs[from].NetNSPath)
	if err != nil {
		return err
	}
	defer src.Close()
	l, err := src.LinkByName(vapName(k))
	if err != nil {
		return fmt.Errorf("%s on %s: %w", vapName(k), st.APs[from].Name, err)
	}
	dstNS, err := linux.OpenNetNS(st.APs[to].NetNSPath)
	if err != nil {
		return err
	}
	defer dstNS.Close()
	if err := src.LinkSetNsFd(l, int(dstNS)); err != nil {
		return fmt.Errorf("move %s to %s: %w", vapName(k), st.APs[to].Name, err)
	}
	dst, err := linux.Handle(st.APs[to].NetNSPath)
	if err != nil {
		return err
	}
	defer dst.Close()
	l, err = dst.LinkByName(vapName(k))
	if err != nil {
		return err
	}
	if err := dst.AddrAdd(l, &netlink.Addr{IPNet: ipNet(ClientCoreAddr(k), 24)}); err != nil {
		return fmt.Errorf("address %s: %w", vapName(k), err)
	}
	if err := dst.LinkSetUp(l); err != nil {
		return err
	}
	if err := routeClient(st, k, to); err != nil {
		return err
	}
	// The qdisc went with the move: shape again (the client's end kept
	// its own).
	if err := linkemu.Shape(dst, vapName(k), st.Clients[k].Link.RateBps); err != nil {
		return fmt.Errorf("shape %s: %w", vapName(k), err)
	}
	return nil
}

// wireLinkNamed creates a veth pair between the namespaces a (end aName,
// address aAddr) and b (end bName, address bAddr) on a /24, and routes b's
// default through a.
func wireLinkNamed(aNS, bNS, aName, bName string, aAddr, bAddr netip.Addr) error {
	ah, err := linux.Handle(aNS)
	if err != nil {
		return err
	}
	defer ah.Close()
	bh, err := linux.Handle(bNS)
	if err != nil {
		return err
	}
	defer bh.Close()
	b, err := linux.OpenNetNS(bNS)
	if err != nil {
		return err
	}
	defer b.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName, MTU: UnderlayMTU, TxQLen: 1000}, PeerName: bName, PeerNamespace: netlink.NsFd(int(b))}
	if err := ah.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", aName, err)
	}
	al, err := ah.LinkByName(aName)
	if err != nil {
		return err
	}
	if err := ah.AddrAdd(al, &netlink.Addr{IPNet: ipNet(aAddr, 24)}); err != nil {
		return err
	}
	if err := ah.LinkSetUp(al); err != nil {
		return err
	}
	bl, err := bh.LinkByName(bName)
	if err != nil {
		return err
	}
	if err := bh.LinkSetMTU(bl, UnderlayMTU); err != nil {
		return err
	}
	if err := bh.AddrAdd(bl, &netlink.Addr{IPNet: ipNet(bAddr, 24)}); err != nil {
		return err
	}
	if err := bh.LinkSetUp(bl); err != nil {
		return err
	}
	if err := bh.RouteAdd(&netlink.Route{LinkIndex: bl.Attrs().Index, Gw: aAddr.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return tuneNetNS(bNS)
}

// withLock runs fn holding the testbed's state lock (an flock on a file
// in dir), so the controller's handoffs and link changes made at the same
// time do not overwrite each other's testbed.json.
func withLock(dir string, fn func() error) error {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("testbed lock: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("testbed lock: %w", err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return fn()
}

// Access applies the controller's tier-1 handoffs to a testbed: a user is
// the client of the same name (controller.Access).
type Access struct {
	Root, Name string
}

// Handoff implements controller.Access.
// A first attachment (from "") moves the client from the AP the testbed
// wired it to, if that is not the chosen one.
func (a Access) Handoff(ctx context.Context, user, from, to string) (time.Duration, error) {
	return Handoff(ctx, a.Root, a.Name, user, to)
}

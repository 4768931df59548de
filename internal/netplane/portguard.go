package netplane

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/edgehop/edgehop/internal/linux"
)

// The port guard binds a container's bridge port to its own MAC and
// address: every frame the container sends must carry its MAC as source,
// every IPv4 packet its address, every ARP message both. Without it a
// container with CAP_NET_RAW (by request: runc drops it by default) could
// take over the gateway's or a neighbour's MAC on the bridge, or answer
// ARP for their addresses. The rules are ebtables' (the kernel's bridge
// filter, through nf_tables), in a chain of the port's own, jumped to from
// FORWARD and INPUT for frames entering by the port; they go with the
// port (Unguard, Detach). They are set where the veth is made (Attach:
// run, and a migration's destination before the freeze), so nothing of
// them runs in the frozen window.

// guardChain is the port's ebtables chain: "EH-" and the veth's name.
func guardChain(port string) string { return "EH-" + port }

// ErrNoBridgeFilter means ebtables is missing or the kernel has no bridge
// filter; GuardPort's callers log it and go on unguarded.
var ErrNoBridgeFilter = errors.New("no bridge filter (ebtables)")

// guardRules are the ebtables-restore lines guarding port for mac and ip.
func guardRules(port string, mac net.HardwareAddr, ip netip.Addr) []string {
	c := guardChain(port)
	return []string{
		"*filter",
		":" + c + " RETURN",
		"-A " + c + " -s ! " + mac.String() + " -j DROP",
		"-A " + c + " -p IPv4 --ip-src ! " + ip.String() + " -j DROP",
		"-A " + c + " -p ARP --arp-ip-src ! " + ip.String() + " -j DROP",
		"-A " + c + " -p ARP --arp-mac-src ! " + mac.String() + " -j DROP",
		"-A FORWARD -i " + port + " -j " + c,
		"-A INPUT -i " + port + " -j " + c,
	}
}

// GuardPort binds the bridge port of container to mac and ip (see above).
// A guard left by an earlier agent is replaced.
func (p *Plane) GuardPort(container string, mac net.HardwareAddr, ip netip.Addr) error {
	port := HostIfName(container)
	if _, err := exec.LookPath("ebtables-restore"); err != nil {
		return fmt.Errorf("%w: %v", ErrNoBridgeFilter, err)
	}
	// One ebtables-restore, about 3 ms. A guard left by a crash is
	// refilled (declaring its chain flushes it; its jumps then appear
	// twice, which changes nothing and Unguard removes); should the
	// restore fail, the guard is removed and made again.
	err := p.restoreGuard(port, mac, ip)
	if err != nil {
		if uerr := p.UnguardPort(container); uerr != nil {
			return errors.Join(err, uerr)
		}
		err = p.restoreGuard(port, mac, ip)
	}
	if err != nil {
		return fmt.Errorf("guard port %s of %s: %w", port, container, err)
	}
	return nil
}

func (p *Plane) restoreGuard(port string, mac net.HardwareAddr, ip netip.Addr) error {
	cmd := linux.Command(p.ns, "ebtables-restore", "--noflush")
	cmd.Stdin = strings.NewReader(strings.Join(guardRules(port, mac, ip), "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// SweepGuards removes the guards of ports that no longer exist (their
// veth went while no agent ran): Setup calls it.
func (p *Plane) SweepGuards() error {
	out, err := linux.Command(p.ns, "ebtables", "-L").CombinedOutput()
	if err != nil {
		if _, lerr := exec.LookPath("ebtables"); lerr != nil {
			return nil // nothing can have been guarded
		}
		return fmt.Errorf("ebtables -L: %w: %s", err, bytes.TrimSpace(out))
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		rest, ok := strings.CutPrefix(line, "Bridge chain: EH-")
		if !ok {
			continue
		}
		port, _, _ := strings.Cut(rest, ",")
		if _, err := p.h.LinkByName(port); err == nil {
			continue
		}
		c := guardChain(port)
		for _, chain := range []string{"FORWARD", "INPUT"} {
			for n := 0; n < 8 && p.ebtables("-D", chain, "-i", port, "-j", c) == nil; n++ {
			}
		}
		if err := p.ebtables("-F", c); err != nil {
			errs = append(errs, err)
		} else if err := p.ebtables("-X", c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// UnguardPort removes container's port guard; a missing one is not an
// error.
func (p *Plane) UnguardPort(container string) error {
	port := HostIfName(container)
	c := guardChain(port)
	var errs []error
	for _, chain := range []string{"FORWARD", "INPUT"} {
		// Each -D removes one jump: an interrupted guard may have left two.
		for n := 0; n < 8 && p.ebtables("-D", chain, "-i", port, "-j", c) == nil; n++ {
		}
	}
	if p.ebtables("-L", c) == nil {
		// nf_tables deletes only an empty chain.
		if err := p.ebtables("-F", c); err != nil {
			errs = append(errs, err)
		} else if err := p.ebtables("-X", c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PortGuarded reports whether container's port has its guard chain, and
// the chain's rules as ebtables lists them.
func (p *Plane) PortGuarded(container string) (bool, string) {
	out, err := linux.Command(p.ns, "ebtables", "-L", guardChain(HostIfName(container))).CombinedOutput()
	return err == nil, string(out)
}

func (p *Plane) ebtables(args ...string) error {
	out, err := linux.Command(p.ns, "ebtables", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ebtables %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

package netplane

import (
	"bytes"
	"fmt"
	"net/netip"

	"github.com/edgehop/edgehop/internal/linux"
)

// VTEPGuardChain is the filter chain GuardVTEP fills.
const VTEPGuardChain = "EDGEHOP-VTEP"

// GuardVTEP lets VXLAN (UDP VXLANPort) into the plane's namespace only
// from peers, the VTEPs of the overlay's other agents. A Linux VXLAN
// device takes frames from any sender and, learning off or not, puts them
// on the bridge: anyone who reaches the VTEP could send a service frames
// with any other service's address. The rules live in their own chain,
// rewritten on every call, with one jump from INPUT added once, so an
// agent that restarts (or whose peers changed) calls it again.
func (p *Plane) GuardVTEP(peers []netip.Addr) error {
	lines := []string{":" + VTEPGuardChain + " - [0:0]", "-F " + VTEPGuardChain}
	for _, a := range peers {
		if !a.IsValid() {
			return fmt.Errorf("guard VTEP: invalid peer address %v", a)
		}
		lines = append(lines, fmt.Sprintf("-A %s -s %s -j RETURN", VTEPGuardChain, netip.PrefixFrom(a, a.BitLen())))
	}
	lines = append(lines, "-A "+VTEPGuardChain+" -j DROP")
	if err := iptablesRestore(p.ns, "filter", lines); err != nil {
		return fmt.Errorf("guard VTEP: iptables-restore: %w", err)
	}
	jump := []string{"INPUT", "-p", "udp", "--dport", fmt.Sprint(VXLANPort), "-j", VTEPGuardChain}
	if linux.Command(p.ns, "iptables", append([]string{"-w", "-C"}, jump...)...).Run() == nil {
		return nil
	}
	if out, err := linux.Command(p.ns, "iptables", append([]string{"-w", "-I"}, jump...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("guard VTEP: jump from INPUT: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

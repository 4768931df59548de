package netplane

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"

	"github.com/edgehop/edgehop/internal/linux"
)

// criuLockRules is CRIU's own network-lock chain (criu/netfilter.c): every
// packet is dropped except those CRIU marks while it repairs sockets.
// CRIU removes the chain when a restore completes.
const criuLockRules = `*filter
:CRIU - [0:0]
-I INPUT -j CRIU
-I OUTPUT -j CRIU
-A CRIU -m mark --mark 0xC114 -j ACCEPT
-A CRIU -j DROP
COMMIT
`

// Lock loads CRIU's lock chain into the namespace at nsPath, so that
// clients' retransmissions to a service restored there are dropped (not
// reset) until CRIU has repaired its sockets. It must run before the
// namespace's link comes up.
func Lock(nsPath string) error {
	for _, tool := range []string{"iptables-restore", "ip6tables-restore"} {
		cmd := linux.Command(nsPath, tool, "-w", "--noflush")
		cmd.Stdin = bytes.NewBufferString(criuLockRules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s lock chain: %v: %s", tool, err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// Unlock removes CRIU's lock chain from the namespace at nsPath (a failed
// dump leaves it behind). A namespace without the chain is not an error.
func Unlock(nsPath string) error {
	var errs []error
	for _, tool := range []string{"iptables", "ip6tables"} {
		if linux.Command(nsPath, tool, "-w", "-n", "-L", "CRIU").Run() != nil {
			continue
		}
		for _, args := range [][]string{{"-D", "INPUT", "-j", "CRIU"}, {"-D", "OUTPUT", "-j", "CRIU"}, {"-F", "CRIU"}, {"-X", "CRIU"}} {
			if out, err := linux.Command(nsPath, tool, append([]string{"-w"}, args...)...).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s %v: %v: %s", tool, args, err, bytes.TrimSpace(out)))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("unlock %s: %v", nsPath, errs)
	}
	return nil
}

// Locked reports whether the CRIU lock chain is present in nsPath.
func Locked(nsPath string) bool {
	return linux.Command(nsPath, "iptables", "-w", "-n", "-L", "CRIU").Run() == nil
}

// GatewayMAC is the gateway's bridge MAC, derived from its address like
// every overlay MAC, so containers can carry a static neighbour entry for
// it and need no ARP after a migration.
func GatewayMAC(gw netip.Addr) net.HardwareAddr { return MACFor(gw) }

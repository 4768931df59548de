package netplane

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// TestGuardVTEP: with the guard, VXLAN from an address that is not a
// peer's VTEP goes nowhere while other UDP passes; naming the sender a
// peer (GuardVTEP again, as an agent restarted with new peers) lets it in,
// and the chain is reached by one jump however often GuardVTEP ran.
func TestGuardVTEP(t *testing.T) {
	p := newHoldPair(t) // client 10.232.0.1 → service 10.232.0.2
	vx := udpIn(t, p.svcNS, VXLANPort)
	plane, err := Open(p.svcNS, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer plane.Close()
	vxTo := &net.UDPAddr{IP: net.IPv4(10, 232, 0, 2), Port: VXLANPort}
	// arrives sends msg to the VXLAN port three times and reports whether
	// any arrived.
	arrives := func(msg string) bool {
		t.Helper()
		for range 3 {
			if _, err := p.client.WriteToUDP([]byte(msg), vxTo); err != nil {
				t.Fatal(err)
			}
		}
		buf := make([]byte, 64)
		for {
			_ = vx.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, _, err := vx.ReadFromUDP(buf)
			if err != nil {
				return false
			}
			if string(buf[:n]) == msg {
				return true
			}
		}
	}
	if !arrives("before") {
		t.Fatal("test setup: VXLAN port unreachable before the guard")
	}
	other := netip.MustParseAddr("10.232.0.9")
	if err := plane.GuardVTEP([]netip.Addr{other}); err != nil {
		t.Fatal(err)
	}
	if arrives("stranger") {
		t.Error("VXLAN from 10.232.0.1, not a peer, passed the guard")
	}
	p.send(t, "other-port")
	if got, err := p.recv(time.Second); err != nil || got != "other-port" {
		t.Errorf("UDP to another port under the guard: %q, %v", got, err)
	}
	if err := plane.GuardVTEP([]netip.Addr{other, netip.MustParseAddr("10.232.0.1")}); err != nil {
		t.Fatal(err)
	}
	if !arrives("peer") {
		t.Error("VXLAN from a peer's VTEP did not pass the guard")
	}
	out, err := linux.Command(p.svcNS, "iptables", "-w", "-S", "INPUT").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -S: %v: %s", err, out)
	}
	if n := strings.Count(string(out), "-j "+VTEPGuardChain); n != 1 {
		t.Errorf("%d jumps to %s in INPUT, want 1:\n%s", n, VTEPGuardChain, out)
	}
	if err := plane.GuardVTEP([]netip.Addr{{}}); err == nil {
		t.Error("an invalid peer address was accepted")
	}
}

package netplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
	"github.com/vishvananda/netlink"
)

// holdPair is a service namespace (its link is eth0, where the Holder
// acts) and a client namespace joined by a veth pair, with a UDP socket on
// each side.
type holdPair struct {
	svcNS  string
	cliNS  string
	client *net.UDPConn
	server *net.UDPConn
	to     *net.UDPAddr
}

func newHoldPair(t *testing.T) *holdPair {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables", "nsenter")
	svc, cli := testutil.NewNetNS(t, "hlds"), testutil.NewNetNS(t, "hldc")
	sns, err := linux.OpenNetNS(svc)
	if err != nil {
		t.Fatal(err)
	}
	defer sns.Close()
	ch, err := linux.Handle(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cl0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(sns))}); err != nil {
		t.Fatalf("veth: %v", err)
	}
	sh, err := linux.Handle(svc)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	for _, side := range []struct {
		h    *netlink.Handle
		name string
		ip   net.IP
	}{{ch, "cl0", net.IPv4(10, 232, 0, 1)}, {sh, "eth0", net.IPv4(10, 232, 0, 2)}} {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := side.h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: side.ip, Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatal(err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	// The path works (neighbours resolved) before anything is held; a
	// throwaway socket keeps the warm-up traffic out of the test's.
	warm := udpIn(t, svc, 0)
	p := &holdPair{svcNS: svc, cliNS: cli, server: warm, client: udpIn(t, cli, 0)}
	p.to = &net.UDPAddr{IP: net.IPv4(10, 232, 0, 2), Port: warm.LocalAddr().(*net.UDPAddr).Port}
	testutil.Eventually(t, 5*time.Second, func() error {
		p.send(t, "warm-up")
		_, err := p.recv(100 * time.Millisecond)
		return err
	})
	p.server = udpIn(t, svc, 0)
	p.to = &net.UDPAddr{IP: net.IPv4(10, 232, 0, 2), Port: p.server.LocalAddr().(*net.UDPAddr).Port}
	return p
}

func (p *holdPair) send(t *testing.T, msg string) {
	t.Helper()
	if _, err := p.client.WriteToUDP([]byte(msg), p.to); err != nil {
		t.Fatalf("send %q: %v", msg, err)
	}
}

// recv reads one datagram at the service, waiting at most d.
func (p *holdPair) recv(d time.Duration) (string, error) {
	buf := make([]byte, 256)
	_ = p.server.SetReadDeadline(time.Now().Add(d))
	n, _, err := p.server.ReadFromUDP(buf)
	return string(buf[:n]), err
}

func holdRulePresent(ns string) bool { return Holding(ns) }

// TestHolder: packets arriving while held reach nobody; Release delivers
// every one of them in arrival order and lets later ones pass, Drop
// delivers none; Close (after Release) and Drop leave the path open and
// the rule removed.
func TestHolder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		release  bool
		wantHeld int
	}{
		{"release delivers in order", true, 5},
		{"drop discards", false, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newHoldPair(t)
			h, ended := startHold(t, Hold, p.svcNS)
			if !holdRulePresent(p.svcNS) {
				t.Fatal("hold rule missing while holding")
			}
			var sent []string
			for i := range tc.wantHeld {
				msg := fmt.Sprintf("held-%d", i)
				sent = append(sent, msg)
				p.send(t, msg)
			}
			testutil.Eventually(t, 5*time.Second, func() error {
				if n := h.Held(); n != tc.wantHeld {
					return fmt.Errorf("held %d of %d", n, tc.wantHeld)
				}
				return nil
			})
			// Every packet is in the queue, so none can have reached the socket.
			if got, err := p.recv(50 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("while held the service read %q (err %v)", got, err)
			}
			if tc.release {
				n, err := h.Release()
				if err != nil || n != tc.wantHeld {
					t.Fatalf("Release = %d, %v; want %d", n, err, tc.wantHeld)
				}
				for _, want := range sent {
					got, err := p.recv(2 * time.Second)
					if err != nil || got != want {
						t.Fatalf("after release read %q (err %v), want %q", got, err, want)
					}
				}
				// Released but not closed: the rule is there, packets pass.
				if !holdRulePresent(p.svcNS) {
					t.Fatal("Release removed the rule; Close should")
				}
				p.send(t, "released")
				if got, err := p.recv(2 * time.Second); err != nil || got != "released" {
					t.Fatalf("after Release read %q (err %v), want \"released\"", got, err)
				}
				if err := h.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
			} else if err := h.Drop(); err != nil {
				t.Fatalf("Drop: %v", err)
			}
			*ended = true
			if holdRulePresent(p.svcNS) {
				t.Fatal("hold rule left behind")
			}
			// The path is open again: the next packet is the next one read.
			p.send(t, "after")
			got, err := p.recv(2 * time.Second)
			if err != nil || got != "after" {
				t.Fatalf("after the end read %q (err %v), want \"after\"", got, err)
			}
		})
	}
}

// TestHolderHoldsOutgoing: what the held service sends waits too, so a
// copy that is rolled back never spoke; Release lets it out.
func TestHolderHoldsOutgoing(t *testing.T) {
	p := newHoldPair(t)
	// The client learns the server's address from a first exchange.
	p.send(t, "hello")
	if _, err := p.recv(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	h, err := Hold(p.svcNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	back := p.client.LocalAddr().(*net.UDPAddr)
	back = &net.UDPAddr{IP: net.IPv4(10, 232, 0, 1), Port: back.Port}
	if _, err := p.server.WriteToUDP([]byte("reply"), back); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() error {
		if h.Held() != 1 {
			return fmt.Errorf("held %d, want the reply", h.Held())
		}
		return nil
	})
	buf := make([]byte, 64)
	_ = p.client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _, err := p.client.ReadFromUDP(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client read %q from a held service", buf[:n])
	}
	if _, err := h.Release(); err != nil {
		t.Fatal(err)
	}
	_ = p.client.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, _, err := p.client.ReadFromUDP(buf); err != nil || string(buf[:n]) != "reply" {
		t.Fatalf("after release the client read %q, %v", buf[:n], err)
	}
}

// TestHolderDiesDropping: when the holding process is gone (its agent was
// killed) its rules stay and drop the service's packets, never let them
// through to a half-restored service; Unhold opens the path.
func TestHolderDiesDropping(t *testing.T) {
	p := newHoldPair(t)
	h, err := Hold(p.svcNS)
	if err != nil {
		t.Fatal(err)
	}
	p.listenerDies(t, h)
	if !Holding(p.svcNS) {
		t.Fatal("rules gone with the listener")
	}
	if err := Unhold(p.svcNS); err != nil {
		t.Fatal(err)
	}
	if Holding(p.svcNS) {
		t.Fatal("Unhold left the rules")
	}
	if err := Unhold(p.svcNS); err != nil {
		t.Fatalf("Unhold without rules: %v", err)
	}
	p.send(t, "open")
	if got, err := p.recv(2 * time.Second); err != nil || got != "open" {
		t.Fatalf("after Unhold read %q (err %v), want \"open\"", got, err)
	}
}

// TestHoldFrozen: before Arm every packet passes both ways; armed, what
// enters is held with its contents kept (the sender's MAC and the whole
// IP packet, to forward), what the namespace sends is dropped, not held;
// Close lets the held packets in, in order, and Drop discards them; either
// leaves the path open and no rule behind, as does Unhold after a holder
// that died.
func TestHoldFrozen(t *testing.T) {
	for _, end := range []string{"close", "drop", "died"} {
		t.Run(end, func(t *testing.T) {
			p := newHoldPair(t)
			h, ended := startHold(t, HoldFrozen, p.svcNS)
			back := &net.UDPAddr{IP: net.IPv4(10, 232, 0, 1), Port: p.client.LocalAddr().(*net.UDPAddr).Port}
			buf := make([]byte, 64)
			clientRead := func(d time.Duration) (string, error) {
				_ = p.client.SetReadDeadline(time.Now().Add(d))
				n, _, err := p.client.ReadFromUDP(buf)
				return string(buf[:n]), err
			}
			p.send(t, "unarmed")
			if got, err := p.recv(2 * time.Second); err != nil || got != "unarmed" {
				t.Fatalf("before Arm the service read %q (err %v)", got, err)
			}
			if _, err := p.server.WriteToUDP([]byte("unarmed-reply"), back); err != nil {
				t.Fatal(err)
			}
			if got, err := clientRead(2 * time.Second); err != nil || got != "unarmed-reply" {
				t.Fatalf("before Arm the client read %q (err %v)", got, err)
			}
			if h.Held() != 0 {
				t.Fatalf("held %d before Arm", h.Held())
			}
			h.Arm()
			sent := []string{"frozen-0", "frozen-1", "frozen-2"}
			for _, m := range sent {
				p.send(t, m)
			}
			testutil.Eventually(t, 5*time.Second, func() error {
				if n := h.Held(); n != len(sent) {
					return fmt.Errorf("held %d of %d", n, len(sent))
				}
				return nil
			})
			if got, err := p.recv(50 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("armed, the service read %q (err %v)", got, err)
			}
			if _, err := p.server.WriteToUDP([]byte("frozen-reply"), back); err != nil {
				t.Fatal(err)
			}
			if got, err := clientRead(100 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("armed, the client read %q from the service (err %v)", got, err)
			}
			if n := h.Held(); n != len(sent) {
				t.Fatalf("held %d after the service sent: its packet is to be dropped, not held", n)
			}
			kept := h.Kept()
			if len(kept) != len(sent) {
				t.Fatalf("kept %d packets, want %d", len(kept), len(sent))
			}
			cl := linkMAC(t, p.cliNS, "cl0")
			for i, pk := range kept {
				if pk.From.String() != cl.String() || !strings.HasSuffix(string(pk.IP), sent[i]) || ipv4Source(pk.IP) != netip.MustParseAddr("10.232.0.1") {
					t.Fatalf("kept packet %d: from %v, %d bytes ending %q; want from %v with %q", i, pk.From, len(pk.IP), pk.IP[max(0, len(pk.IP)-8):], cl, sent[i])
				}
			}
			switch end {
			case "close":
				if err := h.Close(); err != nil {
					t.Fatal(err)
				}
				for _, want := range sent {
					if got, err := p.recv(2 * time.Second); err != nil || got != want {
						t.Fatalf("after Close read %q (err %v), want %q", got, err, want)
					}
				}
			case "drop":
				if err := h.Drop(); err != nil {
					t.Fatal(err)
				}
			case "died":
				p.listenerDies(t, h)
				if err := Unhold(p.svcNS); err != nil {
					t.Fatal(err)
				}
			}
			*ended = true
			if frozenRulePresent(p.svcNS) {
				t.Fatal("frozen hold's rules left behind")
			}
			p.send(t, "after")
			if got, err := p.recv(2 * time.Second); err != nil || got != "after" {
				t.Fatalf("after the end read %q (err %v), want \"after\"", got, err)
			}
		})
	}
}

// listenerDies does to h what the kernel sees when its agent dies: the
// queue's listener goes. The rules stay and drop the service's packets.
func (p *holdPair) listenerDies(t *testing.T, h *Holder) {
	t.Helper()
	h.cancel()
	if err := h.nf.Close(); err != nil {
		t.Fatal(err)
	}
	p.send(t, "orphan")
	if got, err := p.recv(200 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("without a listener the service read %q (err %v); want the packet dropped", got, err)
	}
}

func frozenRulePresent(ns string) bool { return rulePresent(ns, frozenRules[0]) }

func linkMAC(t *testing.T, ns, name string) net.HardwareAddr {
	t.Helper()
	h, err := linux.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().HardwareAddr
}

// startHold starts a holder in ns; the test's cleanup drops it unless
// the test set *ended (it ended the holder itself).
func startHold(t *testing.T, start func(string) (*Holder, error), ns string) (*Holder, *bool) {
	t.Helper()
	h, err := start(ns)
	if err != nil {
		t.Fatal(err)
	}
	ended := new(bool)
	t.Cleanup(func() {
		if !*ended {
			_ = h.Drop()
		}
	})
	return h, ended
}

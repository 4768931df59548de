package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/agent"
	"github.com/edgehop/edgehop/internal/api"
	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/netplane"
	"github.com/edgehop/edgehop/internal/pki"
	"github.com/edgehop/edgehop/internal/testbed"
	"net/netip"
)

// dialFrom connects to addr from inside the namespace at ns.
func dialFrom(ns, addr string) (net.Conn, error) {
	var c net.Conn
	err := linux.InNetNS(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	return c, err
}

// TestClientCannotDriveNodes: from a client's namespace no agent port of
// any node, nor the core's, nor the controller's agent port, accepts a
// connection; a node without a certificate gets no answer from a peer's
// API; a node's certificate cannot rewrite another node's endpoints; and
// the operator's routes are not served over TCP at all.
func TestClientCannotDriveNodes(t *testing.T) {
	e := newEnv(t)
	spec := testbed.DefaultSpec(e.name, 3, 1)
	st := e.upAPI(spec, testbed.Options{})
	var c ctr
	e.mustJSON(&c, "run", "--node", "node0", "--name", "p", "--image", "probe", "--json")

	targets := []string{net.JoinHostPort(testbed.CoreVTEP.String(), fmt.Sprint(testbed.AgentPort)),
		net.JoinHostPort(testbed.CoreVTEP.String(), fmt.Sprint(testbed.ControllerAgentPort))}
	for _, n := range st.Nodes {
		targets = append(targets, net.JoinHostPort(n.Address, fmt.Sprint(testbed.AgentPort)), net.JoinHostPort(n.Address, fmt.Sprint(testbed.MigratePort)))
	}
	for _, addr := range targets {
		conn, err := dialFrom(st.Clients[0].NetNSPath, addr)
		if err == nil {
			conn.Close()
			t.Errorf("client0 connected to %s", addr)
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("client0 to %s: %v, want connection refused", addr, err)
		}
	}
	checkNoOverlayInjection(t, st, c)
	// Nodes still reach each other's peer API (that is how they learn
	// endpoints): node2, with its certificate, reads node0's.
	node2TLS := filepath.Join(st.Nodes[2].StateDir, "tls")
	var eps []api.Endpoint
	// Every connection is opened inside node2's namespace.
	dial := nsDialer{st.Nodes[2].NetNSPath}.DialContext
	err := func() (err error) {
		cfg, err := pki.ClientConfig(node2TLS, "node0")
		if err != nil {
			return err
		}
		cl := api.NewTCPClient(st.Nodes[0].API, &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DialContext: dial}})
		ctx := context.Background()
		if eps, err = cl.Endpoints(ctx); err != nil {
			return fmt.Errorf("endpoints: %w", err)
		}
		// node2 cannot say node1's endpoints live at node1's VTEP.
		ip := netip.MustParseAddr("10.200.2.77")
		forged := api.Endpoint{Name: "x", IP: ip.String(), MAC: netplane.MACFor(ip).String(), VTEP: st.Nodes[1].Address, Node: "node1"}
		if err := cl.Announce(ctx, forged); !errors.Is(err, api.ErrForbidden) {
			return fmt.Errorf("a forged announcement: %v, want forbidden", err)
		}
		// The operator's routes do not exist on the peer API.
		for _, p := range []string{"/v1/containers", "/v1/migrations"} {
			if err := cl.Do(ctx, http.MethodPost, p, map[string]string{"name": "evil", "image": "probe"}, nil); err == nil {
				return fmt.Errorf("POST %s on the peer API succeeded", p)
			}
		}
		// Without a certificate the handshake fails.
		plain := api.NewTCPClient(st.Nodes[0].API, &http.Client{Timeout: 3 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DialContext: dial}})
		if _, err := plain.Endpoints(ctx); err == nil {
			return errors.New("a client without a certificate read the endpoints")
		}
		return nil
	}()
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0].Name != "p" {
		t.Errorf("node0's endpoints as node2 reads them: %+v", eps)
	}
	// Nothing was created or moved anywhere.
	out := e.must("ps", "--json")
	if strings.Count(out, `"name"`) != 1 {
		t.Errorf("ps after the attempts: %s", out)
	}
}

// checkNoOverlayInjection: a VXLAN frame sent to node0's VTEP from a
// client's namespace (or a container's) does not reach container c, whose
// UDP socket would take it; the same frame from node1, a VTEP of the
// overlay, does (so the frame is one the overlay delivers).
func checkNoOverlayInjection(t *testing.T, st *testbed.State, c ctr) {
	t.Helper()
	ip := netip.MustParseAddr(c.IP)
	cns := filepath.Join(st.Nodes[0].StateDir, "netns", c.Name)
	var ln net.PacketConn
	err := linux.InNetNS(cns, func() error {
		var err error
		ln, err = net.ListenPacket("udp4", ":9999")
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s's namespace: %v", c.Name, err)
	}
	defer ln.Close()
	vtep := net.JoinHostPort(st.Nodes[0].Address, fmt.Sprint(netplane.VXLANPort))
	// got sends the frame from the namespace at from and reports whether
	// it arrived, and from which underlay address it left.
	got := func(from, payload string) (bool, netip.Addr) {
		t.Helper()
		frame := vxlanFrame(agent.DefaultVNI, netplane.MACFor(ip), testbed.OverlayGW, ip, 9999, []byte(payload))
		var local netip.Addr
		err := linux.InNetNS(from, func() error {
			u, err := net.Dial("udp4", vtep)
			if err != nil {
				return err
			}
			defer u.Close()
			local = u.LocalAddr().(*net.UDPAddr).AddrPort().Addr()
			for range 3 {
				if _, err := u.Write(frame); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("send from %s: %v", from, err)
		}
		buf := make([]byte, 64)
		for {
			_ = ln.SetReadDeadline(time.Now().Add(time.Second))
			n, _, err := ln.ReadFrom(buf)
			if err != nil {
				return false, local
			}
			if string(buf[:n]) == payload {
				return true, local
			}
		}
	}
	if ok, _ := got(st.Clients[0].NetNSPath, "from-client"); ok {
		t.Errorf("a VXLAN frame from client0 reached %s", c.Name)
	}
	if ok, _ := got(cns, "from-container"); ok {
		t.Errorf("a VXLAN frame from container %s, through the overlay, reached it", c.Name)
	}
	// The core's guard does not see what the core sends itself: from its
	// link address, which is no VTEP, the frame meets node0's own guard.
	ok, local := got(st.Core.NetNSPath, "from-core-link")
	if local == testbed.CoreVTEP {
		t.Fatalf("test setup: the core sent from its VTEP %v", local)
	}
	if ok {
		t.Errorf("a VXLAN frame from %v, no peer's VTEP, reached %s: node0's agent lets in VXLAN from anyone", local, c.Name)
	}
	if ok, local := got(st.Nodes[1].NetNSPath, "from-node1"); !ok {
		t.Errorf("test setup: the same VXLAN frame from node1 (%v) did not reach %s", local, c.Name)
	}
}

// vxlanFrame is a VXLAN payload (RFC 7348) carrying an Ethernet frame to
// dst with one IPv4 UDP datagram from src to dstIP:port.
func vxlanFrame(vni int, dst net.HardwareAddr, src, dstIP netip.Addr, port uint16, payload []byte) []byte {
	b := []byte{0x08, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
	b = append(b, dst...)
	b = append(b, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00)
	ipStart := len(b)
	total := 20 + 8 + len(payload)
	b = append(b, 0x45, 0, byte(total>>8), byte(total), 0, 1, 0, 0, 64, 17, 0, 0)
	b = append(b, src.AsSlice()...)
	b = append(b, dstIP.AsSlice()...)
	var sum uint32
	for i := ipStart; i < ipStart+20; i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	b[ipStart+10], b[ipStart+11] = byte(^sum>>8), byte(^sum)
	udpLen := 8 + len(payload)
	b = append(b, 0x15, 0xb3, byte(port>>8), byte(port), byte(udpLen>>8), byte(udpLen), 0, 0)
	return append(b, payload...)
}

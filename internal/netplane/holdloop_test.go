package netplane

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// TestHoldLoopback: a pod's hold of loopback keeps what one member sends
// another (a connection over 127.0.0.1 in one namespace) until it ends:
// Close lets it through at once, Drop discards it and the sender's
// retransmission arrives; neither resets the connection. HoldPod holds
// loopback as well, and Unhold removes every such rule a dead agent left.
func TestHoldLoopback(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables", "nsenter")
	ns := testutil.NewNetNS(t, "hloop")
	var srv, cli net.Conn
	if err := linux.InNetNS(ns, func() error {
		if err := linux.Command(ns, "ip", "link", "set", "lo", "up").Run(); err != nil {
			return err
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		if cli, err = net.Dial("tcp4", ln.Addr().String()); err != nil {
			return err
		}
		srv, err = ln.Accept()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	defer cli.Close()
	// send writes msg, which must not arrive within held.
	send := func(what, msg string, held time.Duration) {
		t.Helper()
		if _, err := io.WriteString(cli, msg); err != nil {
			t.Fatalf("%s: write: %v", what, err)
		}
		buf := make([]byte, len(msg))
		_ = srv.SetReadDeadline(time.Now().Add(held))
		if n, err := srv.Read(buf); err == nil || n > 0 {
			t.Fatalf("%s: %q arrived while held", what, buf[:n])
		}
	}
	recv := func(what, msg string) {
		t.Helper()
		buf := make([]byte, len(msg))
		_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != msg {
			t.Fatalf("%s: got %q, %v; want %q", what, buf, err, msg)
		}
	}
	for _, c := range []struct {
		what string
		hold func(string) (*Holder, error)
		drop bool
	}{{"loopback close", HoldLoopback, false}, {"loopback drop", HoldLoopback, true}, {"pod close", HoldPod, false}} {
		h, err := c.hold(ns)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		send(c.what, c.what, 200*time.Millisecond)
		if h.Held() == 0 {
			t.Fatalf("%s: nothing held", c.what)
		}
		if c.drop {
			err = h.Drop()
		} else {
			err = h.Close()
		}
		if err != nil {
			t.Fatalf("%s: end the hold: %v", c.what, err)
		}
		recv(c.what, c.what)
	}
	// A connection that went through all of it still works both ways.
	if _, err := io.WriteString(srv, "back"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	_ = cli.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(cli, buf); err != nil || string(buf) != "back" {
		t.Fatalf("reply after the holds: %q, %v", buf, err)
	}
	// Rules left by a holder whose agent died go with Unhold.
	h, err := HoldPod(ns)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := HoldLoopback(ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := Unhold(ns); err != nil {
		t.Fatal(err)
	}
	out, err := linux.Command(ns, "iptables", "-w", "-t", "mangle", "-S").CombinedOutput()
	if err != nil || strings.Contains(string(out), "NFQUEUE") {
		t.Fatalf("rules left after Unhold (%v):\n%s", err, out)
	}
	h.cancel()
	h.nf.Close()
	h2.cancel()
	h2.nf.Close()
}

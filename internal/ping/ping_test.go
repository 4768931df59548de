package ping

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/testutil"
)

// TestInNamespace pings inside a namespace of its own: loopback answers,
// an address with no route does not.
func TestInNamespace(t *testing.T) {
	ns := testutil.NewNetNS(t, "ping")
	h, err := linux.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	var p *Pinger
	if err := linux.InNetNS(ns, func() (err error) { p, err = Open(); return err }); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := p.Median(ctx, netip.MustParseAddr("127.0.0.1"), 3, 10*time.Millisecond, time.Second)
	if err != nil || d <= 0 || d > time.Second {
		t.Fatalf("loopback RTT %v, %v", d, err)
	}
	c2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if _, err := p.RTT(c2, netip.MustParseAddr("10.99.0.1")); err == nil {
		t.Error("a reply from an address with no route")
	}
}

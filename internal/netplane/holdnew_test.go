package netplane

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// TestHoldNewAndPending: a connection the service has not accepted is
// counted as queued; while new connections are held a client's connect
// gets no answer and nothing new is queued; Close lets the held request
// in (the connect completes at once), and after Drop the client's own
// SYN retransmission gets through.
func TestHoldNewAndPending(t *testing.T) {
	p := newHoldPair(t)
	var ln net.Listener
	if err := linux.InNetNS(p.svcNS, func() (err error) {
		ln, err = net.Listen("tcp4", "10.232.0.2:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	dial := func() chan error {
		done := make(chan error, 1)
		go func() {
			err := linux.InNetNS(p.cliNS, func() error {
				c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
				if err == nil {
					// Kept open: the server side stays queued.
					t.Cleanup(func() { c.Close() })
				}
				return err
			})
			done <- err
		}()
		return done
	}
	pending := func() (int, int) {
		t.Helper()
		hs, q, err := Pending(p.svcNS)
		if err != nil {
			t.Fatal(err)
		}
		return hs, q
	}
	if hs, q := pending(); hs != 0 || q != 0 {
		t.Fatalf("nothing connected yet, pending %d handshaking, %d queued", hs, q)
	}
	if err := <-dial(); err != nil {
		t.Fatal(err)
	}
	if hs, q := pending(); hs != 0 || q != 1 {
		t.Fatalf("one unaccepted connection: pending %d handshaking, %d queued", hs, q)
	}

	for _, release := range []string{"close", "drop"} {
		h, err := HoldNew(p.svcNS)
		if err != nil {
			t.Fatal(err)
		}
		if !Holding(p.svcNS) && !synHolding(p.svcNS) {
			t.Fatal("no hold rule")
		}
		started := time.Now()
		done := dial()
		select {
		case err := <-done:
			t.Fatalf("%s: connect completed while new connections are held (err %v)", release, err)
		case <-time.After(300 * time.Millisecond):
		}
		if hs, q := pending(); hs != 0 || q < 1 {
			t.Fatalf("%s: while held, pending %d handshaking, %d queued", release, hs, q)
		}
		// The held request is kept whole, with its sender's MAC, to be
		// forwarded.
		kept := h.Kept()
		if len(kept) == 0 || len(kept[0].From) != 6 || len(kept[0].IP) < 40 || kept[0].IP[0]>>4 != 4 || kept[0].IP[9] != 6 || kept[0].IP[33]&0x12 != 0x02 {
			t.Fatalf("%s: kept %+v, want the client's TCP SYN", release, kept)
		}
		if !tcpChecksumOK(kept[0].IP) {
			t.Fatalf("%s: the kept SYN's TCP checksum is not complete: forwarded, it would be dropped", release)
		}
		if release == "close" {
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
		} else if err := h.Drop(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s: connect after the hold: %v", release, err)
		}
		took := time.Since(started)
		t.Logf("%s: connect completed after %v", release, took)
		if release == "drop" && took < time.Second {
			t.Errorf("drop: connect completed after %v, before any SYN retransmission", took)
		}
		if synHolding(p.svcNS) {
			t.Errorf("%s: hold rule left behind", release)
		}
	}

	// A request from an exempt address (another member of the group)
	// goes through at once; the hold stays for everyone else.
	h, err := HoldNew(p.svcNS, netip.MustParseAddr("10.232.0.9"), netip.MustParseAddr("10.232.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-dial():
		if err != nil {
			t.Fatalf("exempt client: %v", err)
		}
	case <-time.After(900 * time.Millisecond):
		t.Fatal("a request from an exempt address was held")
	}
	if n := len(h.Kept()); n != 0 {
		t.Fatalf("kept %d requests from an exempt address", n)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
}

func synHolding(ns string) bool { return rulePresent(ns, synRules[0]) }

// tcpChecksumOK verifies an IPv4 TCP packet's checksum.
func tcpChecksumOK(ip []byte) bool {
	ihl := int(ip[0]&0x0f) * 4
	total := int(ip[2])<<8 | int(ip[3])
	if total > len(ip) || ihl < 20 || total < ihl+20 {
		return false
	}
	seg := ip[ihl:total]
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(ip[12:20]) // source and destination addresses
	sum += 6 + uint32(len(seg))
	add(seg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

// WaitSettled returns at once when nothing is pending, gives up on a
// connection nobody accepts (counted as queued) once the count stalled,
// and waits past its stall bound while a slow service drains its queue.
func TestWaitSettled(t *testing.T) {
	p := newHoldPair(t)
	if hs, q, err := WaitSettled(p.svcNS, time.Second, time.Second, true); err != nil || hs+q != 0 {
		t.Fatalf("nothing pending: %d, %d, %v", hs, q, err)
	}
	var ln net.Listener
	if err := linux.InNetNS(p.svcNS, func() (err error) {
		ln, err = net.Listen("tcp4", "10.232.0.2:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := linux.InNetNS(p.cliNS, func() error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, q, err := WaitSettled(p.svcNS, 50*time.Millisecond, 10*time.Second, false); err != nil || q != 1 ||
		time.Since(start) < 50*time.Millisecond || time.Since(start) > 5*time.Second {
		t.Fatalf("an unaccepted connection: queued %d, %v after %v; want 1 once the count stalled for 50ms", q, err, time.Since(start))
	}

	// Nine more queued, accepted one every 40 ms: longer than the stall
	// bound in all, never stalled for it.
	for range 9 {
		if err := linux.InNetNS(p.cliNS, func() error {
			c, err := net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
			if err == nil {
				t.Cleanup(func() { c.Close() })
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		for range 10 {
			time.Sleep(40 * time.Millisecond)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	start = time.Now()
	_, q, err := WaitSettled(p.svcNS, 100*time.Millisecond, 10*time.Second, false)
	if took := time.Since(start); err != nil || q != 0 || took < 300*time.Millisecond {
		t.Fatalf("a queue drained slowly: queued %d, %v after %v; want 0 after about 400ms", q, err, took)
	}
}

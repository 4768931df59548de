package agent

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
)

func TestPagePortsBelowEphemeral(t *testing.T) {
	var p pagePorts
	addr, err := p.pick()
	if err != nil {
		t.Fatal(err)
	}
	eph, err := ephemeralLow()
	if err != nil {
		t.Fatal(err)
	}
	_, ps, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(ps)
	if port >= eph || port < eph-pagePortSpan {
		t.Fatalf("picked %s, want a port in [%d, %d)", addr, eph-pagePortSpan, eph)
	}
	if err := bindLoopback(port); err != nil {
		t.Fatalf("picked port not bindable: %v", err)
	}
}

// A port held by another socket, even a SO_REUSEADDR listener like Go's,
// is skipped: CRIU binds without SO_REUSEADDR and would fail on it.
func TestPagePortsSkipsBusyAndRotates(t *testing.T) {
	// Find two adjacent free ports to use as the whole range.
	var lo int
	for cand := 20000; cand < 30000; cand += 2 {
		if bindLoopback(cand) == nil && bindLoopback(cand+1) == nil {
			lo = cand
			break
		}
	}
	if lo == 0 {
		t.Fatal("no two adjacent free loopback ports in 20000-30000")
	}
	busy, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lo))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	p := pagePorts{lo: lo, hi: lo + 1}
	for i := range 3 {
		addr, err := p.pick()
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		if want := "127.0.0.1:" + strconv.Itoa(lo+1); addr != want {
			t.Fatalf("pick %d = %s, want %s (the free one)", i, addr, want)
		}
	}
	// With both ports busy, pick says so.
	busy2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lo+1))
	if err != nil {
		t.Fatal(err)
	}
	defer busy2.Close()
	if addr, err := p.pick(); err == nil {
		t.Fatalf("pick with every port busy = %s, want an error", addr)
	} else if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("pick error %v does not wrap EADDRINUSE", err)
	}
}

func TestPagePortsRotation(t *testing.T) {
	var lo int
	for cand := 21000; cand < 30000; cand += 3 {
		if bindLoopback(cand) == nil && bindLoopback(cand+1) == nil && bindLoopback(cand+2) == nil {
			lo = cand
			break
		}
	}
	if lo == 0 {
		t.Fatal("no three adjacent free loopback ports")
	}
	p := pagePorts{lo: lo, hi: lo + 2}
	seen := map[string]bool{}
	for range 3 {
		addr, err := p.pick()
		if err != nil {
			t.Fatal(err)
		}
		seen[addr] = true
	}
	if len(seen) != 3 {
		t.Fatalf("three picks gave %v; want three different ports", seen)
	}
}

// A port whose connection is in TIME_WAIT is bindable by a SO_REUSEADDR
// socket but not by CRIU; pick skips it.
func TestPagePortsSkipsTimeWait(t *testing.T) {
	var lo int
	for cand := 22000; cand < 30000; cand += 2 {
		if bindLoopback(cand) == nil && bindLoopback(cand+1) == nil {
			lo = cand
			break
		}
	}
	if lo == 0 {
		t.Fatal("no two adjacent free loopback ports")
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lo))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	s.Close() // the server side closes first: its port goes to TIME_WAIT
	buf := make([]byte, 1)
	_, _ = c.Read(buf)
	c.Close()
	if err := bindLoopback(lo); !errors.Is(err, syscall.EADDRINUSE) {
		t.Skipf("port %d in TIME_WAIT still bindable without SO_REUSEADDR (%v); nothing to check on this kernel", lo, err)
	}
	p := pagePorts{lo: lo, hi: lo + 1}
	addr, err := p.pick()
	if err != nil {
		t.Fatal(err)
	}
	if want := "127.0.0.1:" + strconv.Itoa(lo+1); addr != want {
		t.Fatalf("pick = %s, want %s", addr, want)
	}
}

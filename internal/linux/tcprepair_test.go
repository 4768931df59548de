package linux

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestEndTCPRepair: a connection this process put in repair mode (as
// CRIU's dump does) is found among its sockets and taken out of it; the
// second pass finds nothing; the connection then carries data both ways.
func TestEndTCPRepair(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: TCP_REPAIR needs root (CAP_NET_ADMIN)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	raw, err := server.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_TCP, unix.TCP_REPAIR, 1)
	}); err != nil || serr != nil {
		t.Fatalf("repair on: %v %v", err, serr)
	}
	n, err := endTCPRepairOf(os.Getpid(), map[uint64]bool{})
	if err != nil || n != 1 {
		t.Fatalf("first pass: %d sockets taken out of repair, err %v; want 1", n, err)
	}
	if n, err := endTCPRepairOf(os.Getpid(), map[uint64]bool{}); err != nil || n != 0 {
		t.Fatalf("second pass: %d, %v; want 0", n, err)
	}
	for _, dir := range []struct {
		from, to net.Conn
	}{{client, server}, {server, client}} {
		if _, err := dir.from.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		_ = dir.to.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(dir.to, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("after repair: read %q, %v", buf, err)
		}
	}
}

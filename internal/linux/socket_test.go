package linux

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A seqpacket pair keeps message boundaries, and its peer credentials
// are this process's.
func TestSeqpacketPairPeerCredentials(t *testing.T) {
	a, b, err := SeqpacketPair("a", "b")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	for _, m := range []string{"one", "two"} {
		if _, err := a.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 16)
	if n, err := b.Read(buf); err != nil || string(buf[:n]) != "one" {
		t.Fatalf("first message %q, %v; want one", buf[:n], err)
	}
	rc, err := b.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	cred, err := PeerCredentials(rc)
	if err != nil {
		t.Fatal(err)
	}
	if int(cred.Pid) != os.Getpid() || int(cred.Uid) != os.Geteuid() {
		t.Errorf("peer pid %d uid %d, want %d %d", cred.Pid, cred.Uid, os.Getpid(), os.Geteuid())
	}
}

// A receive buffer set with SO_RCVBUF shows (doubled, as the kernel
// books it) in the socket's options; TCP_INFO reads on a connected
// socket.
func TestReadBufferAndTCPInfo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	var setErr error
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { setErr = SetReadBufferFD(fd, 64<<10) })
	}}
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if setErr != nil {
		t.Fatal(setErr)
	}
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	if err := rc.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF) }); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if got != 2*64<<10 {
		t.Errorf("SO_RCVBUF %d, want %d", got, 2*64<<10)
	}
	force := errors.New("not run")
	if err := rc.Control(func(fd uintptr) { force = SetReadBufferForceFD(fd, 128<<10) }); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 && force != nil {
		t.Errorf("SO_RCVBUFFORCE as root: %v", force)
	}
	info, err := GetTCPInfo(rc)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != 1 { // TCP_ESTABLISHED
		t.Errorf("TCP state %d, want established", info.State)
	}
}

func TestNiceGettid(t *testing.T) {
	if n, err := Nice(); err != nil || n < -20 || n > 19 {
		t.Errorf("Nice() = %d, %v", n, err)
	}
	if Gettid() <= 0 {
		t.Errorf("Gettid() = %d", Gettid())
	}
	// Setting this process's own group's nice to what it is changes
	// nothing and needs no privilege.
	n, _ := Nice()
	if err := SetGroupNice(syscall.Getpgrp(), n); err != nil {
		t.Errorf("SetGroupNice to the same value: %v", err)
	}
}

func TestMapAnonymous(t *testing.T) {
	b, err := MapAnonymous(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b[0], b[len(b)-1] = 1, 2
	if err := Unmap(b); err != nil {
		t.Fatal(err)
	}
}

func TestStatFileSystem(t *testing.T) {
	st, err := StatFileSystem(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if st.Size == 0 || st.Avail > st.Size {
		t.Errorf("%+v: want a size, and no more available than that", st)
	}
	if _, err := StatFileSystem(filepath.Join(t.TempDir(), "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing path: %v, want ENOENT", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	dir := t.TempDir()
	if err := MountTmpfsReadOnly(dir, "size=64k,mode=755", func() error {
		return os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(dir) })
	st, err = StatFileSystem(dir)
	if err != nil || st.Type != TmpfsMagic || !st.ReadOnly || !st.NoDev {
		t.Errorf("the filled tmpfs: %+v %v, want a read-only nodev tmpfs", st, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "x" {
		t.Errorf("what fill wrote: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "g"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write after the fill: %v, want EROFS", err)
	}
	other := t.TempDir()
	failed := errors.New("fill failed")
	if err := MountTmpfsReadOnly(other, "size=64k", func() error { return failed }); !errors.Is(err, failed) {
		t.Errorf("a failed fill: %v", err)
	}
	if IsMountPoint(other) {
		_ = Unmount(other)
		t.Error("a failed fill left the tmpfs mounted")
	}
}

// A frame goes out of the loopback device through a FrameSender.
func TestFrameSender(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs CAP_NET_RAW")
	}
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip("no loopback device:", err)
	}
	to := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	s, err := OpenFrameSender(lo.Index, EtherTypeIPv4, to)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	frame := append(append(append([]byte{}, to...), 2, 0, 0, 0, 0, 2), 0x08, 0x00)
	frame = append(frame, make([]byte, 20)...) // not a valid IPv4 header: the stack drops it
	if err := s.Send(frame); err != nil {
		t.Fatal(err)
	}
}

func TestSyncfs(t *testing.T) {
	f, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Syncfs(f); err != nil {
		t.Fatal(err)
	}
}

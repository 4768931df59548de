package transfer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
	"github.com/edgehop/edgehop/internal/pki"
)

// nodes issues certificates for the named nodes from a fresh CA (or from
// ca when given) and returns their directories.
func nodes(t testing.TB, ca *pki.CA, names ...string) (map[string]string, *pki.CA) {
	t.Helper()
	root := t.TempDir()
	if ca == nil {
		var err error
		if ca, err = pki.NewCA(filepath.Join(root, "ca")); err != nil {
			t.Fatal(err)
		}
	}
	dirs := map[string]string{}
	for _, n := range names {
		dirs[n] = filepath.Join(root, n)
		if err := ca.Issue(dirs[n], n, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	return dirs, ca
}

func serverCfg(t testing.TB, dir string) *tls.Config {
	t.Helper()
	cfg, err := pki.ServerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func clientCfg(t testing.TB, dir, server string) *tls.Config {
	t.Helper()
	cfg, err := pki.ClientConfig(dir, server)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// listen starts a listener for node dir on loopback, closed on cleanup.
func listen(t testing.TB, dir string) *Listener {
	t.Helper()
	l, err := Listen(context.Background(), "127.0.0.1:0", serverCfg(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// tlsPair connects client to server over loopback mTLS.
func tlsPair(t testing.TB, dirs map[string]string, server, client string) (srv, cli *Conn) {
	t.Helper()
	l := listen(t, dirs[server])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctx)
		ch <- res{c, err}
	}()
	cli, err := Dial(ctx, l.Addr().String(), clientCfg(t, dirs[client], server))
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { cli.Close(); r.c.Close() })
	return r.c, cli
}

func TestTLSRoundTripAndPeerNames(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1", "edge2")
	srv, cli := tlsPair(t, dirs, "edge1", "edge2")
	if srv.Peer() != "edge2" || cli.Peer() != "edge1" {
		t.Fatalf("peers: server sees %q, client sees %q", srv.Peer(), cli.Peer())
	}
	t.Logf("socket note: %q", cli.SocketNote())

	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, filepath.Join(src, "pages-1.img"), compressible(5<<20, 1), 0o600)
	writeFile(t, filepath.Join(src, "sub", "core.img"), randomBytes(1<<20, 2), 0o600)
	ctx := context.Background()
	done := make(chan result, 1)
	go func() {
		st, err := cli.SendDir(ctx, src, SendOptions{Compression: CompressAuto})
		done <- result{st, err}
	}()
	dst := filepath.Join(t.TempDir(), "dst")
	rst, err := srv.RecvDir(ctx, dst, RecvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := <-done
	if s.err != nil {
		t.Fatal(s.err)
	}
	compareTrees(t, src, dst)
	if s.st.Digest != rst.Digest {
		t.Fatalf("digest %x vs %x", s.st.Digest, rst.Digest)
	}
	// And back the other way, a message.
	if err := srv.WriteMsg(ctx, "restored", map[string]int{"ms": 12}); err != nil {
		t.Fatal(err)
	}
	if typ, body, err := cli.ReadMsg(ctx); err != nil || typ != "restored" || !bytes.Equal(body, []byte(`{"ms":12}`)) {
		t.Fatalf("ReadMsg = %q %s %v", typ, body, err)
	}
}

func TestTLSRejections(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1", "edge2")
	// Impostors: the right names from another CA, trusting the real CA
	// (its certificate is public), so only the signature is wrong.
	foreign, _ := nodes(t, nil, "edge1", "edge2")
	caPEM, err := os.ReadFile(filepath.Join(dirs["edge1"], pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range foreign {
		if err := os.WriteFile(filepath.Join(d, pki.CACertFile), caPEM, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name      string
		serverDir string
		clientDir string
		expect    string
	}{
		{"client from another CA", dirs["edge1"], foreign["edge2"], "edge1"},
		{"server from another CA", foreign["edge1"], dirs["edge2"], "edge1"},
		{"wrong expected server name", dirs["edge1"], dirs["edge2"], "edge3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, tc.serverDir)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			acc := make(chan error, 1)
			go func() {
				c, err := l.Accept(ctx)
				if c != nil {
					c.Close()
				}
				acc <- err
			}()
			c, err := Dial(ctx, l.Addr().String(), clientCfg(t, tc.clientDir, tc.expect))
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !errors.Is(err, ErrHandshake) {
				t.Errorf("Dial: %v, want ErrHandshake", err)
			}
			aerr := <-acc
			if !errors.Is(aerr, ErrHandshake) {
				t.Errorf("Accept: %v, want ErrHandshake", aerr)
			}
			t.Logf("dial: %v; accept: %v", err, aerr)

			if tc.serverDir != dirs["edge1"] {
				return
			}
			// The listener survives a failed handshake.
			go func() {
				c, err := l.Accept(ctx)
				if c != nil {
					c.Close()
				}
				acc <- err
			}()
			good, err := Dial(ctx, l.Addr().String(), clientCfg(t, dirs["edge2"], "edge1"))
			if err != nil {
				t.Fatalf("good client after a bad one: %v", err)
			}
			good.Close()
			if err := <-acc; err != nil {
				t.Fatalf("Accept of the good client: %v", err)
			}
		})
	}
}

func TestDialUnreachable(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge2")
	// A port that was just free: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = Dial(context.Background(), addr, clientCfg(t, dirs["edge2"], "edge1"))
	if err == nil {
		t.Fatal("Dial succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, addr) || !strings.Contains(msg, "agent is running") {
		t.Fatalf("error %q does not name %s and the agent", msg, addr)
	}
}

func TestAcceptCancelled(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1", "edge2")
	l := listen(t, dirs["edge1"])
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Accept(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Accept returned after %v", d)
	}
	// The listener still works after a cancelled Accept (its deadline was
	// reset).
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	acc := make(chan error, 1)
	go func() {
		c, err := l.Accept(ctx2)
		if c != nil {
			c.Close()
		}
		acc <- err
	}()
	c, err := Dial(ctx2, l.Addr().String(), clientCfg(t, dirs["edge2"], "edge1"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
}

func TestTLSCancelMidTransfer(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1", "edge2")
	srv, cli := tlsPair(t, dirs, "edge1", "edge2")
	// The receiver (srv) reads nothing; the sender fills the buffers and
	// blocks inside a TLS write.
	_ = srv
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	_, err := cli.SendStream(ctx, endless{}, SendOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 2300*time.Millisecond {
		t.Fatalf("returned after %v", d)
	}
}

// TestWindowOpenFromHandshake checks that a fresh connection's peer
// offers its whole window before any bulk data has crossed: the images of
// a migration's frozen window go out in one flight, not in the round
// trips autotuning needs to open a window that starts at about 64 KB.
func TestWindowOpenFromHandshake(t *testing.T) {
	dirs, _ := nodes(t, nil, "edge1", "edge2")
	srv, cli := tlsPair(t, dirs, "edge1", "edge2")
	for _, side := range []struct {
		name string
		c    *Conn
	}{{"dialling side", cli}, {"accepting side", srv}} {
		if n := side.c.SocketNote(); strings.Contains(n, "receive window left to autotuning") {
			t.Skipf("probed: this process may not size receive buffers past net.core.rmem_max (%s)", n)
		}
		info, err := tcpInfo(side.c)
		if err != nil {
			t.Fatal(err)
		}
		// The peer's window as this side sees it after the handshake
		// and the greeting: a buffer left to autotuning offers 64-128 KB.
		if info.Snd_wnd < 4<<20 {
			t.Errorf("%s: peer's window after the handshake %d bytes, want >= 4 MiB", side.name, info.Snd_wnd)
		}
	}
}

func tcpInfo(c *Conn) (*linux.TCPInfo, error) {
	rc, err := c.raw.(*net.TCPConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	return linux.GetTCPInfo(rc)
}

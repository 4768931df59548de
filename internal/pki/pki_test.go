package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testbed is a CA with nodes issued into per-node directories.
type testbed struct {
	root string
	ca   *CA
}

func newTestbed(t *testing.T) *testbed {
	t.Helper()
	root := t.TempDir()
	ca, err := NewCA(filepath.Join(root, "ca"))
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	return &testbed{root: root, ca: ca}
}

func (tb *testbed) node(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(tb.root, name)
	if err := tb.ca.Issue(dir, name, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatalf("Issue %s: %v", name, err)
	}
	return dir
}

// handshake runs a TLS handshake over an in-memory pipe, then the server
// sends one byte that the client reads: with TLS 1.3 a client learns that
// the server refused its certificate only when it next reads. It returns the
// peer names each side saw and each side's error.
func handshake(t *testing.T, serverCfg, clientCfg *tls.Config) (serverSaw, clientSaw string, serverErr, clientErr error) {
	t.Helper()
	return handshakeAs(t, PeerName, serverCfg, clientCfg)
}

// handshakeAs is handshake with the server naming its peer by whom (the
// node, or the operator, a certificate names).
func handshakeAs(t *testing.T, whom func(tls.ConnectionState) (string, error), serverCfg, clientCfg *tls.Config) (serverSaw, clientSaw string, serverErr, clientErr error) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	deadline := time.Now().Add(10 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)

	type result struct {
		name string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		s := tls.Server(a, serverCfg)
		err := s.Handshake()
		var name string
		if err == nil {
			name, err = whom(s.ConnectionState())
		}
		if err == nil {
			_, err = s.Write([]byte{1})
		}
		if err != nil {
			a.Close() // unblock the client
		}
		done <- result{name, err}
	}()
	c := tls.Client(b, clientCfg)
	clientErr = c.Handshake()
	if clientErr == nil {
		clientSaw, clientErr = PeerName(c.ConnectionState())
	}
	if clientErr == nil {
		_, clientErr = io.ReadFull(c, make([]byte, 1))
	}
	if clientErr != nil {
		b.Close()
	}
	r := <-done
	return r.name, clientSaw, r.err, clientErr
}

func TestHandshakeBetweenIssuedNodes(t *testing.T) {
	tb := newTestbed(t)
	srvDir, cliDir := tb.node(t, "edge1"), tb.node(t, "edge2")
	srvCfg, err := ServerConfig(srvDir)
	if err != nil {
		t.Fatal(err)
	}
	cliCfg, err := ClientConfig(cliDir, "edge1")
	if err != nil {
		t.Fatal(err)
	}
	serverSaw, clientSaw, serr, cerr := handshake(t, srvCfg, cliCfg)
	if serr != nil || cerr != nil {
		t.Fatalf("handshake: server %v, client %v", serr, cerr)
	}
	if serverSaw != "edge2" || clientSaw != "edge1" {
		t.Fatalf("peer names: server saw %q (want edge2), client saw %q (want edge1)", serverSaw, clientSaw)
	}
}

func TestHandshakeRejections(t *testing.T) {
	tb := newTestbed(t)
	other := newTestbed(t)
	expired := newTestbed(t)
	expired.ca.Now = func() time.Time { return time.Now().Add(-48 * time.Hour) }
	expired.ca.NodeValidity = 24 * time.Hour

	good1, good2 := tb.node(t, "edge1"), tb.node(t, "edge2")
	// Impostors: certificates from another CA for the right names, with the
	// real CA certificate as their trust anchor (it is public), so the only
	// thing wrong is who signed them.
	foreign := impostor(t, tb, other, "edge1")
	foreignCli := impostor(t, tb, other, "edge2")
	// An expired certificate from the right CA: issue it with the real CA
	// key but a clock two days back.
	stale := filepath.Join(tb.root, "stale")
	tb.ca.Now, tb.ca.NodeValidity = expired.ca.Now, expired.ca.NodeValidity
	if err := tb.ca.Issue(stale, "edge1", nil); err != nil {
		t.Fatal(err)
	}
	tb.ca.Now, tb.ca.NodeValidity = nil, 0

	// Every case must fail on both sides: the side that detects the problem
	// aborts the handshake, and the other sees the alert.
	tests := []struct {
		name              string
		serverDir, cliDir string
		expect            string // server name the client expects
		detector          string // side whose own verification must fail
	}{
		{name: "client from another CA", serverDir: good1, cliDir: foreignCli, expect: "edge1", detector: "server"},
		{name: "server from another CA", serverDir: foreign, cliDir: good2, expect: "edge1", detector: "client"},
		{name: "wrong expected server name", serverDir: good1, cliDir: good2, expect: "edge3", detector: "client"},
		{name: "expired server certificate", serverDir: stale, cliDir: good2, expect: "edge1", detector: "client"},
		{name: "expired client certificate", serverDir: good2, cliDir: stale, expect: "edge2", detector: "server"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srvCfg, err := ServerConfig(tc.serverDir)
			if err != nil {
				t.Fatal(err)
			}
			cliCfg, err := ClientConfig(tc.cliDir, tc.expect)
			if err != nil {
				t.Fatal(err)
			}
			_, _, serr, cerr := handshake(t, srvCfg, cliCfg)
			if serr == nil {
				t.Errorf("server accepted the connection")
			}
			if cerr == nil {
				t.Errorf("client accepted the connection")
			}
			// The detecting side reports its own verification failure;
			// the other side only hears an alert.
			own := serr
			if tc.detector == "client" {
				own = cerr
			}
			var verr *tls.CertificateVerificationError
			if !errors.As(own, &verr) {
				t.Errorf("%s error %v is not its own certificate verification failure", tc.detector, own)
			}
			t.Logf("server: %v; client: %v", serr, cerr)
		})
	}
}

// impostor issues name from other's CA into a directory that trusts real's CA.
func impostor(t *testing.T, real, other *testbed, name string) string {
	t.Helper()
	dir := filepath.Join(other.root, "impostor-"+name)
	if err := other.ca.Issue(dir, name, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CACertFile), real.ca.certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestExpiredRejectedByVerifier(t *testing.T) {
	// Independent of TLS: the issued certificate really is expired, so the
	// rejection above is for expiry and not for something else.
	tb := newTestbed(t)
	tb.ca.Now = func() time.Time { return time.Now().Add(-48 * time.Hour) }
	tb.ca.NodeValidity = 24 * time.Hour
	dir := tb.node(t, "old")
	cfg, err := ServerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(tb.ca.Cert)
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool})
	var inv x509.CertificateInvalidError
	if !errors.As(err, &inv) || inv.Reason != x509.Expired {
		t.Fatalf("verify expired leaf: %v, want x509.Expired", err)
	}
}

func TestNewCAIdempotentAndFileModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca1, err := NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := NewCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ca1.Cert.SerialNumber.Cmp(ca2.Cert.SerialNumber) != 0 {
		t.Fatalf("second NewCA made a new CA: serial %v then %v", ca1.Cert.SerialNumber, ca2.Cert.SerialNumber)
	}
	node := filepath.Join(t.TempDir(), "n")
	if err := ca2.Issue(node, "n1", nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, CAKeyFile), filepath.Join(node, NodeKeyFile)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	name, err := NodeName(node)
	if err != nil || name != "n1" {
		t.Fatalf("NodeName = %q, %v; want n1", name, err)
	}

	// A certificate without its key is refused, not silently replaced.
	if err := os.Remove(filepath.Join(dir, CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewCA(dir); err == nil {
		t.Fatal("NewCA with ca.key missing: no error")
	}
}

func TestIssueRejectsBadNames(t *testing.T) {
	tb := newTestbed(t)
	for _, name := range []string{"", "-x", "a b", "../x", "a/b"} {
		err := tb.ca.Issue(filepath.Join(tb.root, "bad"), name, nil)
		if !errors.Is(err, ErrBadNodeName) {
			t.Errorf("Issue(%q) = %v, want ErrBadNodeName", name, err)
		}
	}
}

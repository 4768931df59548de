package pki

import (
	"crypto/tls"
	"path/filepath"
	"testing"
)

func (tb *testbed) operator(t *testing.T, name string) string {
	t.Helper()
	dir := filepath.Join(tb.root, "op-"+name)
	if err := tb.ca.IssueOperator(dir, name); err != nil {
		t.Fatalf("IssueOperator %s: %v", name, err)
	}
	return dir
}

// opHandshake is handshake with an operator listener on the server side:
// the operator the server saw, the server's and the client's errors.
func opHandshake(t *testing.T, serverCfg, clientCfg *tls.Config) (string, error, error) {
	t.Helper()
	name, _, serr, cerr := handshakeAs(t, OperatorName, serverCfg, clientCfg)
	return name, serr, cerr
}

func TestOperatorCertificates(t *testing.T) {
	tb := newTestbed(t)
	nodeDir := tb.node(t, "edge1")
	otherNode := tb.node(t, "edge2")
	opDir := tb.operator(t, "alice")
	srv, err := OperatorServerConfig(nodeDir)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := OperatorClientConfig(opDir, "edge1")
	if err != nil {
		t.Fatal(err)
	}
	name, serr, cerr := opHandshake(t, srv, cli)
	if serr != nil || cerr != nil || name != "alice" {
		t.Fatalf("operator handshake: saw %q, server %v, client %v", name, serr, cerr)
	}

	// A node's certificate is not an operator's.
	nodeCli, err := ClientConfig(otherNode, "edge1")
	if err != nil {
		t.Fatal(err)
	}
	if _, serr, _ := opHandshake(t, srv, nodeCli); serr == nil {
		t.Error("operator listener accepted a node certificate")
	}
	// An operator's certificate is not a node's: the peer API refuses it.
	peerSrv, err := ServerConfig(nodeDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, serr, _ := handshake(t, peerSrv, cli); serr == nil {
		t.Error("peer listener accepted an operator certificate")
	}
	// An operator of another CA is refused.
	other := newTestbed(t)
	strangerCli, err := OperatorClientConfig(other.operator(t, "alice"), "edge1")
	if err != nil {
		t.Fatal(err)
	}
	strangerCli.RootCAs = cli.RootCAs // it trusts our node, but our node does not trust it
	if _, serr, _ := opHandshake(t, srv, strangerCli); serr == nil {
		t.Error("operator listener accepted an operator of another CA")
	}
	// The operator's client refuses a server that is not the node it asked for.
	cli2, err := OperatorClientConfig(opDir, "edge2")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, cerr := opHandshake(t, srv, cli2); cerr == nil {
		t.Error("operator client accepted edge1 when it asked for edge2")
	}
	if err := tb.ca.IssueOperator(filepath.Join(tb.root, "bad"), "../x"); err == nil {
		t.Error("issued an operator certificate for a path-like name")
	}
}

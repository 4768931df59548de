package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Files in an operator directory: ca.crt, operator.crt, operator.key.
const (
	OperatorCertFile = "operator.crt"
	OperatorKeyFile  = "operator.key"
)

// operatorOU marks operator certificates; operatorScheme and its opaque
// part name the operator in the certificate's only URI.
const (
	operatorOU     = "operator"
	operatorScheme = "edgehop"
	operatorPrefix = "operator:"
)

// ErrNotOperator is returned by OperatorName when the peer's verified
// certificate is not an operator certificate.
var ErrNotOperator = errors.New("not an edgehop operator certificate")

// IssueOperator creates a key and a client certificate for operator name
// and writes them with the CA certificate into dir (0700; the key 0600).
// An operator certificate carries no DNS name or address and only client
// use, and its only URI is edgehop:operator:NAME, so it never passes as a
// node's, nor a node's as an operator's.
func (ca *CA) IssueOperator(dir, name string) error {
	if !nodeNameRE.MatchString(name) {
		return fmt.Errorf("%w: operator %q (letters, digits, '-' and '.', at most 63)", ErrBadNodeName, name)
	}
	return ca.sign(dir, OperatorCertFile, OperatorKeyFile, "operator "+name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{"edgehop"}, OrganizationalUnit: []string{operatorOU}},
		URIs:        []*url.URL{{Scheme: operatorScheme, Opaque: operatorPrefix + name}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// OperatorName returns the operator named by the verified certificate of
// a completed handshake, or ErrNotOperator.
func OperatorName(cs tls.ConnectionState) (string, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", ErrNotOperator
	}
	return certOperatorName(cs.VerifiedChains[0][0])
}

func certOperatorName(c *x509.Certificate) (string, error) {
	if len(c.DNSNames) != 0 || len(c.IPAddresses) != 0 || len(c.URIs) != 1 ||
		len(c.Subject.OrganizationalUnit) != 1 || c.Subject.OrganizationalUnit[0] != operatorOU {
		return "", ErrNotOperator
	}
	u := c.URIs[0]
	name, ok := strings.CutPrefix(u.Opaque, operatorPrefix)
	if u.Scheme != operatorScheme || !ok || name != c.Subject.CommonName || !nodeNameRE.MatchString(name) {
		return "", ErrNotOperator
	}
	return name, nil
}

// OperatorServerConfig returns a TLS 1.3 configuration for an agent's
// operator listener: it presents the node certificate of node directory
// dir and accepts only clients with an operator certificate of the CA.
func OperatorServerConfig(dir string) (*tls.Config, error) {
	return serverConfig(dir, func(cs tls.ConnectionState) error {
		_, err := OperatorName(cs)
		return err
	})
}

// OperatorClientConfig returns a TLS 1.3 configuration for an operator
// (operator directory dir) talking to node serverName's agent: it
// presents the operator certificate and accepts only that node's
// certificate from the CA.
func OperatorClientConfig(dir, serverName string) (*tls.Config, error) {
	if serverName == "" {
		return nil, errors.New("operator client config: empty server name")
	}
	cert, pool, err := loadPair(dir, OperatorCertFile, OperatorKeyFile, "operator")
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cert},
		RootCAs:          pool,
		ServerName:       serverName,
		VerifyConnection: verifyPeerName,
	}, nil
}

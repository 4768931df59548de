package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/edgehop/edgehop/internal/linux"
)

// File names inside a CA or node directory.
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
)

// Validity defaults. A testbed lives for hours or days; node certificates
// outlive it comfortably and the CA outlives every node certificate.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultNodeValidity = 2 * 365 * 24 * time.Hour
	// backdate tolerates clock skew between the CA host and the nodes.
	backdate = time.Hour
)

// Sentinel errors callers may branch on.
var (
	// ErrNoPeerName is returned by PeerName when the connection carries no
	// verified certificate with a node name.
	ErrNoPeerName = errors.New("no verified peer node name")
	// ErrBadNodeName is returned by Issue for names that cannot be a DNS
	// name in a certificate.
	ErrBadNodeName = errors.New("invalid node name")
)

// nodeNameRE accepts DNS-name-like node names: letters, digits, '-', '.',
// starting with a letter or digit.
var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$`)

// CA is a loaded certificate authority that issues node certificates.
//
// Set the exported fields before the first Issue; after that a CA is safe for
// concurrent Issue calls into different directories.
type CA struct {
	// Cert is the CA certificate.
	Cert *x509.Certificate
	// Now is the clock used for a certificate's validity start; nil means
	// time.Now. Tests use it to issue certificates that are already expired.
	Now func() time.Time
	// NodeValidity is how long issued node certificates are valid; zero
	// means DefaultNodeValidity.
	NodeValidity time.Duration

	certPEM []byte
	key     crypto.Signer
}

// NewCA loads the CA kept in dir, or creates one there when dir holds none.
// It is idempotent: calling it again returns the same CA. A directory with
// only one of ca.crt and ca.key is an error rather than overwritten.
func NewCA(dir string) (*CA, error) {
	certPath := filepath.Join(dir, CACertFile)
	keyPath := filepath.Join(dir, CAKeyFile)
	certOK, err := exists(certPath)
	if err != nil {
		return nil, err
	}
	keyOK, err := exists(keyPath)
	if err != nil {
		return nil, err
	}
	switch {
	case certOK && keyOK:
		return loadCA(certPath, keyPath)
	case certOK || keyOK:
		return nil, fmt.Errorf("incomplete CA in %s: need both %s and %s (remove the other to regenerate)", dir, CACertFile, CAKeyFile)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "edgehop testbed CA", Organization: []string{"edgehop"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(DefaultCAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create CA dir: %w", err)
	}
	// Key first: a crash in between leaves only the key, which NewCA reports
	// as incomplete instead of pairing a certificate with a missing key.
	if err := linux.WriteFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := linux.WriteFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	return loadCA(certPath, keyPath)
}

func loadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w", err)
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate %s: %w", certPath, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("CA certificate %s: not a CA", certPath)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key %s: %w", keyPath, err)
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("CA key %s does not match %s", keyPath, certPath)
	}
	return &CA{Cert: cert, certPEM: certPEM, key: key}, nil
}

// Issue creates a key and a certificate for node nodeName, reachable at ips,
// and writes them with the CA certificate into dir (created 0700 if
// missing; the key is 0600). An existing certificate in dir is replaced.
func (ca *CA) Issue(dir, nodeName string, ips []net.IP) error {
	if !nodeNameRE.MatchString(nodeName) {
		return fmt.Errorf("%w: %q (letters, digits, '-' and '.', at most 63)", ErrBadNodeName, nodeName)
	}
	return ca.sign(dir, NodeCertFile, NodeKeyFile, "node "+nodeName, &x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeName, Organization: []string{"edgehop"}},
		DNSNames:    []string{nodeName},
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
}

// sign creates a key, completes tmpl (serial, validity) and signs it, and
// writes the key (0600), the certificate and the CA certificate into dir
// (created 0700), replacing what was there.
func (ca *CA) sign(dir, certFile, keyFile, what string, tmpl *x509.Certificate) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key for %s: %w", what, err)
	}
	if tmpl.SerialNumber, err = newSerial(); err != nil {
		return err
	}
	now := time.Now()
	if ca.Now != nil {
		now = ca.Now()
	}
	validity := ca.NodeValidity
	if validity == 0 {
		validity = DefaultNodeValidity
	}
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-backdate), now.Add(validity)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return fmt.Errorf("sign certificate for %s: %w", what, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create certificate dir: %w", err)
	}
	if err := linux.WriteFileAtomic(filepath.Join(dir, keyFile), keyPEM, 0o600); err != nil {
		return err
	}
	if err := linux.WriteFileAtomic(filepath.Join(dir, certFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return linux.WriteFileAtomic(filepath.Join(dir, CACertFile), ca.certPEM, 0o644)
}

// ServerConfig returns a TLS 1.3 configuration for the agent in node
// directory dir accepting connections: it presents the node certificate and
// requires every client to present a certificate issued by the testbed CA
// that names a node. Use PeerName on the connection state to learn which.
func ServerConfig(dir string) (*tls.Config, error) {
	return serverConfig(dir, verifyPeerName)
}

// serverConfig presents dir's node certificate and accepts clients whose
// certificate the CA issued and verify accepts.
func serverConfig(dir string, verify func(tls.ConnectionState) error) (*tls.Config, error) {
	cert, pool, err := loadNode(dir)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{cert},
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        pool,
		VerifyConnection: verify,
	}, nil
}

// ClientConfig returns a TLS 1.3 configuration for the agent in node
// directory dir connecting to node serverName: it presents the node
// certificate and accepts only a server certificate issued by the testbed
// CA for serverName, whatever address it is dialled at.
func ClientConfig(dir, serverName string) (*tls.Config, error) {
	if serverName == "" {
		return nil, fmt.Errorf("client config: empty server name")
	}
	cert, pool, err := loadNode(dir)
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

// PeerName returns the node name of the authenticated peer of a completed
// handshake: the name in its verified certificate. It fails with
// ErrNoPeerName when the peer's certificate was not verified against a CA.
func PeerName(cs tls.ConnectionState) (string, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", ErrNoPeerName
	}
	return certNodeName(cs.VerifiedChains[0][0])
}

// NodeName returns the node name in the certificate kept in node directory
// dir.
func NodeName(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, NodeCertFile))
	if err != nil {
		return "", fmt.Errorf("read node certificate: %w", err)
	}
	cert, err := parseCert(b)
	if err != nil {
		return "", fmt.Errorf("node certificate in %s: %w", dir, err)
	}
	return certNodeName(cert)
}

// certNodeName is the name edgehop certificates carry twice: as the common
// name and as their only DNS name. Anything else is not a node certificate.
func certNodeName(c *x509.Certificate) (string, error) {
	name := c.Subject.CommonName
	if len(c.DNSNames) != 1 || c.DNSNames[0] != name || !nodeNameRE.MatchString(name) || len(c.URIs) != 0 {
		return "", fmt.Errorf("%w: certificate %q is not an edgehop node certificate", ErrNoPeerName, name)
	}
	return name, nil
}

// verifyPeerName runs after chain verification on both sides and rejects a
// verified certificate that does not carry a node name.
func verifyPeerName(cs tls.ConnectionState) error {
	_, err := PeerName(cs)
	return err
}

func loadNode(dir string) (tls.Certificate, *x509.CertPool, error) {
	return loadPair(dir, NodeCertFile, NodeKeyFile, "node")
}

// loadPair loads a certificate and its key from dir, and the CA
// certificate kept beside them as a pool.
func loadPair(dir, certFile, keyFile, what string) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, certFile), filepath.Join(dir, keyFile))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("load %s certificate from %s: %w", what, dir, err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("read CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return tls.Certificate{}, nil, fmt.Errorf("CA certificate in %s: no PEM certificate", dir)
	}
	return cert, pool, nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return s, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseKey(b []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported key type %T", k)
	}
	return s, nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	da, err1 := x509.MarshalPKIXPublicKey(a)
	db, err2 := x509.MarshalPKIXPublicKey(b)
	return err1 == nil && err2 == nil && bytes.Equal(da, db)
}

func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

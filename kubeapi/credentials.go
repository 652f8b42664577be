package kubeapi

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/noderun/noderun/internal/atomicfile"
)

// CredentialsDir is the API's directory under noderun's state dir: its CA,
// serving certificate and tokens, all root-only.
func CredentialsDir(stateDir string) string { return filepath.Join(stateDir, "api") }

// ServerFile, under noderun's run dir, records the URL the running noderun
// serves the API on, for `noderun kubeconfig` and the client commands.
func ServerFile(runDir string) string { return filepath.Join(runDir, "api-server") }

// StatusSocket is the status API's socket under noderun's run dir, unless
// --status-socket names another.
func StatusSocket(runDir string) string { return filepath.Join(runDir, "noderun.sock") }

// The files under the API's directory (CredentialsDir), all root-only.
const (
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
	servingCert    = "apiserver.crt"
	servingKey     = "apiserver.key"
	ViewTokenFile  = "view.token"
	AdminTokenFile = "admin.token"
)

const (
	// certLifetime is long because nothing renews a certificate while
	// noderun runs; the CA is this node's own and trusted by nothing else.
	certLifetime = 10 * 365 * 24 * time.Hour
	// renewBefore: a serving certificate this close to its end is
	// reissued at start (by the same CA, so kubeconfigs stay valid).
	renewBefore = 365 * 24 * time.Hour
	// minTokenLen refuses a token file someone wrote by hand with too
	// little in it to be a secret.
	minTokenLen = 32
)

// Credentials are what the API serves with and what clients need: the CA
// (its PEM goes into kubeconfigs), the serving certificate and the two
// bearer tokens.
type Credentials struct {
	Dir        string
	CAPEM      []byte
	Cert       tls.Certificate
	ViewToken  string
	AdminToken string
}

// LoadCredentials creates or reuses the CA, the serving certificate and the
// tokens under dir. The serving certificate is reissued when it lacks one
// of hosts (IP addresses or DNS names) or nears its end; everything else is
// kept across restarts, so a kubeconfig written once keeps working.
func LoadCredentials(dir string, hosts []string, now time.Time) (*Credentials, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Whatever made the directory, only root may read the keys.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	ca, caKey, caPEM, err := loadOrCreateCA(dir, now)
	if err != nil {
		return nil, err
	}
	cert, err := loadOrIssueServing(dir, ca, caKey, hosts, now)
	if err != nil {
		return nil, err
	}
	creds := &Credentials{Dir: dir, CAPEM: caPEM, Cert: cert}
	if creds.ViewToken, err = loadOrCreateToken(filepath.Join(dir, ViewTokenFile)); err != nil {
		return nil, err
	}
	if creds.AdminToken, err = loadOrCreateToken(filepath.Join(dir, AdminTokenFile)); err != nil {
		return nil, err
	}
	if creds.ViewToken == creds.AdminToken {
		return nil, fmt.Errorf("%s and %s hold the same token: the view token would grant exec", ViewTokenFile, AdminTokenFile)
	}
	return creds, nil
}

// loadOrCreateCA reads the CA, or makes one when there is none. A CA that
// is there but cannot be used is an error, not replaced: replacing it
// would silently break every kubeconfig handed out.
func loadOrCreateCA(dir string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if errors.Is(err, fs.ErrNotExist) {
		return createCA(certPath, keyPath, now)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("API CA in %s: %w (remove %s and %s to make a new one; kubeconfigs must then be written again)", dir, err, caCertFile, caKeyFile)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, nil, fmt.Errorf("API CA key %s: not an ECDSA key", keyPath)
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, nil, fmt.Errorf("API CA %s: %w", certPath, err)
	}
	if now.After(ca.NotAfter) {
		return nil, nil, nil, fmt.Errorf("API CA %s expired on %s (remove %s and %s to make a new one)", certPath, ca.NotAfter.Format(time.DateOnly), caCertFile, caKeyFile)
	}
	return ca, key, certPEM, nil
}

func createCA(certPath, keyPath string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "noderun-ca@" + host},
		NotBefore:             now.Add(-time.Hour), // a clock a little behind still accepts it
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	// The key first: a certificate without its key would be refused at
	// the next start instead of replaced.
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, nil, err
	}
	if err := atomicfile.WriteFile(certPath, certPEM, 0o600); err != nil {
		return nil, nil, nil, err
	}
	return ca, key, certPEM, nil
}

// loadOrIssueServing reuses the serving certificate when the CA signed it,
// it covers hosts and it is far from its end; otherwise it issues one.
func loadOrIssueServing(dir string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, now time.Time) (tls.Certificate, error) {
	certPath, keyPath := filepath.Join(dir, servingCert), filepath.Join(dir, servingKey)
	if pair, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil && servingValid(pair, ca, hosts, now) {
		return pair, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "noderun-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     ca.NotAfter, // no use outliving the CA
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return tls.Certificate{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := atomicfile.WriteFile(certPath, certPEM, 0o600); err != nil {
		return tls.Certificate{}, err
	}
	return tls.LoadX509KeyPair(certPath, keyPath)
}

func servingValid(pair tls.Certificate, ca *x509.Certificate, hosts []string, now time.Time) bool {
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil || cert.CheckSignatureFrom(ca) != nil || now.Add(renewBefore).After(cert.NotAfter) {
		return false
	}
	for _, h := range hosts {
		if cert.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// loadOrCreateToken reads a token file, or writes a fresh random token.
// An administrator may put a token of their own there (at least 32
// characters); the file is made root-only either way.
func loadOrCreateToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return "", err
		}
		tok := hex.EncodeToString(raw)
		return tok, atomicfile.WriteFile(path, []byte(tok+"\n"), 0o600)
	}
	if err != nil {
		return "", err
	}
	tok := string(bytes.TrimSpace(b))
	if len(tok) < minTokenLen || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return "", fmt.Errorf("token file %s: want at least %d printable characters without spaces (remove it to have one made)", path, minTokenLen)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return "", err
	}
	return tok, nil
}

// Hosts are the names the serving certificate covers for an API listening
// on address: loopback always, the address itself, and for a wildcard
// address every address of the host's interfaces and its name.
func Hosts(address string) []string {
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	add := func(h string) {
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	ip := net.ParseIP(address)
	if ip == nil || !ip.IsUnspecified() {
		add(address)
		return hosts
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
				add(ipn.IP.String())
			}
		}
	}
	if h, err := os.Hostname(); err == nil {
		add(strings.ToLower(h))
	}
	return hosts
}

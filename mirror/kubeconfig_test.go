package mirror

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeCert writes a self-signed client certificate with serial and its
// key into one PEM file, as kubelet-client-current.pem holds both.
func writeCert(t *testing.T, path string, serial int64, mtime time.Time) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "system:node:n1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	b := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

func TestCertReloaderReadsARotatedCertificate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	t0 := time.Now()
	writeCert(t, path, 1, t0)
	r := &certReloader{cert: path, key: path}
	serial := func() int64 {
		c, err := r.get(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.Int64()
	}
	if s := serial(); s != 1 {
		t.Fatalf("serial %d, want 1", s)
	}
	writeCert(t, path, 2, t0.Add(time.Second))
	if s := serial(); s != 2 {
		t.Errorf("after rotation: serial %d, want 2", s)
	}
	// Half written: the last good pair stays in use.
	if err := os.WriteFile(path, []byte("-----BEGIN CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := serial(); s != 2 {
		t.Errorf("with a broken file: serial %d, want the last good 2", s)
	}
}

func TestLoadKubeconfigErrors(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"no context":  "apiVersion: v1\ncurrent-context: x\n",
		"no server":   "current-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nclusters:\n- name: k\n  cluster: {}\n",
		"missing key": "current-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nclusters:\n- name: k\n  cluster: {server: https://x}\nusers:\n- name: u\n  user: {client-certificate: nothere.pem}\n",
	} {
		p := filepath.Join(dir, "k")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadKubeconfig(p); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

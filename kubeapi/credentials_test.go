package kubeapi

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestCredentialsKeptAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "api")
	now := time.Now()
	first, err := LoadCredentials(dir, Hosts("127.0.0.1"), now)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadCredentials(dir, Hosts("127.0.0.1"), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if string(again.CAPEM) != string(first.CAPEM) || again.ViewToken != first.ViewToken || again.AdminToken != first.AdminToken {
		t.Fatal("a restart made new credentials; kubeconfigs handed out would stop working")
	}
	if string(again.Cert.Certificate[0]) != string(first.Cert.Certificate[0]) {
		t.Error("a restart reissued a serving certificate that was still good")
	}
	if first.ViewToken == first.AdminToken || len(first.ViewToken) < minTokenLen {
		t.Errorf("tokens %q and %q", first.ViewToken, first.AdminToken)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v (%v), want 0700", fi.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 6 {
		t.Errorf("%d files in %s, want 6", len(ents), dir)
	}
	for _, e := range ents {
		fi, _ := e.Info()
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", e.Name(), fi.Mode())
		}
	}

	// A new address: a new serving certificate, by the same CA.
	moved, err := LoadCredentials(dir, Hosts("192.0.2.7"), now)
	if err != nil {
		t.Fatal(err)
	}
	if string(moved.CAPEM) != string(first.CAPEM) {
		t.Fatal("a new address replaced the CA")
	}
	leaf, err := x509.ParseCertificate(moved.Cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(moved.CAPEM)
	for _, h := range []string{"192.0.2.7", "127.0.0.1", "localhost", "::1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: pool}); err != nil {
			t.Errorf("serving certificate for %s: %v", h, err)
		}
	}
}

func TestCredentialsRefuseBadFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ViewTokenFile), []byte("short\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCredentials(dir, Hosts("127.0.0.1"), time.Now()); err == nil || !strings.Contains(err.Error(), ViewTokenFile) {
		t.Fatalf("short token file: %v, want an error naming it", err)
	}
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, caCertFile), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCredentials(dir, Hosts("127.0.0.1"), time.Now()); err == nil || !strings.Contains(err.Error(), "CA") {
		t.Fatalf("broken CA: %v, want an error (never a silent new CA)", err)
	}
}

func TestKubeconfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadCredentials(dir, Hosts("127.0.0.1"), time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, admin := range []bool{false, true} {
		b, err := Kubeconfig("https://127.0.0.1:10266", dir, admin)
		if err != nil {
			t.Fatal(err)
		}
		var cfg kubeconfig
		if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(dir, ViewTokenFile)
		if admin {
			want = filepath.Join(dir, AdminTokenFile)
		}
		if got := cfg.Users[0].User.TokenFile; got != want {
			t.Errorf("admin=%v: tokenFile %s, want %s", admin, got, want)
		}
		ca, _ := os.ReadFile(filepath.Join(dir, caCertFile))
		if string(cfg.Clusters[0].Cluster.CertificateAuthorityData) != string(ca) || cfg.Clusters[0].Cluster.Server != "https://127.0.0.1:10266" {
			t.Errorf("cluster %+v", cfg.Clusters[0].Cluster)
		}
		if cfg.CurrentContext != cfg.Contexts[0].Name || cfg.Contexts[0].Context.User != cfg.Users[0].Name {
			t.Errorf("context does not tie user and cluster: %s", b)
		}
	}
}

// The client commands read what the kubeconfig points kubectl at: the CA
// and the token of the role asked for.
func TestClientCredentials(t *testing.T) {
	dir := CredentialsDir(t.TempDir())
	creds, err := LoadCredentials(dir, Hosts("127.0.0.1"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for admin, want := range map[bool]string{false: creds.ViewToken, true: creds.AdminToken} {
		cfg, token, err := ClientCredentials(dir, admin)
		if err != nil || token != want || cfg.RootCAs == nil {
			t.Errorf("admin=%v: %v, token %q, want %q", admin, err, token, want)
		}
	}
	if _, _, err := ClientCredentials(t.TempDir(), false); err == nil {
		t.Error("no error without the API's CA")
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3": "v1.2.3", "1.2.3": "v1.2.3", "v1.2.3-rc.1": "v1.2.3-rc.1",
		"3037c00": "v0.0.0-3037c00", "3037c00-dirty": "v0.0.0-3037c00-dirty",
		"v1.2.3-4-g3037c00": "v1.2.3-4-g3037c00", "dev": "v0.0.0-dev", "": "v0.0.0-unknown",
	} {
		if got := Semver(in); got != want {
			t.Errorf("Semver(%q) = %q, want %q", in, got, want)
		}
	}
}

package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// apiServer is the URL noderun serves its Kubernetes API on.
func (n *node) apiServer() string {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(n.run, "api-server"))
	if err != nil {
		n.t.Fatal(err)
	}
	return string(bytes.TrimSpace(b))
}

// viewCreds are what the node's view kubeconfig gives a client: the API's
// CA and the view token.
func (n *node) viewCreds() (ca *x509.CertPool, token string) {
	n.t.Helper()
	var cfg struct {
		Clusters []struct {
			Cluster struct {
				CA []byte `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			User struct {
				TokenFile string `json:"tokenFile"`
			} `json:"user"`
		} `json:"users"`
	}
	b, err := os.ReadFile(n.kubeconfig(false))
	if err != nil {
		n.t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		n.t.Fatal(err)
	}
	ca = x509.NewCertPool()
	if len(cfg.Clusters) == 0 || len(cfg.Users) == 0 || !ca.AppendCertsFromPEM(cfg.Clusters[0].Cluster.CA) {
		n.t.Fatalf("kubeconfig without a CA or a user:\n%s", b)
	}
	t, err := os.ReadFile(cfg.Users[0].User.TokenFile)
	if err != nil {
		n.t.Fatal(err)
	}
	return ca, strings.TrimSpace(string(t))
}

// apiClient trusts the node's API CA, as a kubeconfig from it does.
func (n *node) apiClient() *http.Client {
	n.t.Helper()
	ca, _ := n.viewCreds()
	return trustingClient(ca, 10*time.Second)
}

// trustingClient is an HTTPS client that trusts ca; 0 is no timeout.
func trustingClient(ca *x509.CertPool, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca}}}
}

// Who may do what: no token 401, plain HTTP refused, the view token reads
// but cannot exec (403), each through the real kubectl where it can show it.
func TestKubeAPIAccess(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("web.yaml", idlePod)
	n.waitPod("web", "Running", running)
	view, admin := n.kubeconfig(false), n.kubeconfig(true)
	for _, cfg := range []string{view, admin} {
		if fi, err := os.Stat(cfg); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", cfg, fi.Mode(), err)
		}
	}

	out, errOut, err := n.kubectl(view, "get", "pod", "web-e2e", "-o", "name")
	if err != nil || strings.TrimSpace(out) != "pod/web-e2e" {
		t.Fatalf("kubectl get with the view token: %v %q\n%s", err, out, errOut)
	}
	out, errOut, err = n.kubectl(view, "exec", "web-e2e", "--", "true")
	if err == nil || !strings.Contains(errOut, `pods "web-e2e" is forbidden`) {
		t.Errorf("kubectl exec with the view token: %v, want Forbidden\n%s%s", err, out, errOut)
	}

	server, hc := n.apiServer(), n.apiClient()
	resp, err := hc.Get(server + "/api/v1/pods")
	if err != nil {
		t.Fatal(err)
	}
	var st metav1.Status
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(body, &st) != nil || st.Reason != metav1.StatusReasonUnauthorized {
		t.Errorf("no token: %s %s, want 401 with a Status", resp.Status, body)
	}

	plain := "http://" + strings.TrimPrefix(server, "https://")
	resp, err = (&http.Client{Timeout: 10 * time.Second}).Get(plain + "/api/v1/pods")
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 || strings.Contains(string(body), "web-e2e") {
			t.Errorf("plain HTTP served: %s %s", resp.Status, body)
		}
	}
}

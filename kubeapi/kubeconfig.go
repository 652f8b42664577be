package kubeapi

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// kubeconfig is the part of client-go's kubeconfig format noderun writes
// (client-go itself stays out of noderun's binary).
type kubeconfig struct {
	APIVersion     string         `json:"apiVersion"`
	Kind           string         `json:"kind"`
	Clusters       []namedCluster `json:"clusters"`
	Users          []namedUser    `json:"users"`
	Contexts       []namedContext `json:"contexts"`
	CurrentContext string         `json:"current-context"`
}

type namedCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server                   string `json:"server"`
		CertificateAuthorityData []byte `json:"certificate-authority-data"`
	} `json:"cluster"`
}

type namedUser struct {
	Name string `json:"name"`
	User struct {
		TokenFile string `json:"tokenFile"`
	} `json:"user"`
}

type namedContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster   string `json:"cluster"`
		User      string `json:"user"`
		Namespace string `json:"namespace,omitempty"`
	} `json:"context"`
}

// Kubeconfig is a kubeconfig for server (https://host:port) that trusts
// the CA in dir (the API's directory, as LoadCredentials made it) and
// reads the view token, or the admin token, from its file there: the token
// itself is not copied, so the kubeconfig works only for whoever may read
// that file (root).
func Kubeconfig(server, dir string, admin bool) ([]byte, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, fmt.Errorf("the API's CA: %w (noderun makes it when it starts)", err)
	}
	user := "noderun-view"
	if admin {
		user = "noderun-admin"
	}
	abs, err := filepath.Abs(filepath.Join(dir, tokenFile(admin)))
	if err != nil {
		return nil, err
	}
	cfg := kubeconfig{APIVersion: "v1", Kind: "Config", CurrentContext: "noderun"}
	var c namedCluster
	c.Name = "noderun"
	c.Cluster.Server = server
	c.Cluster.CertificateAuthorityData = caPEM
	var u namedUser
	u.Name = user
	u.User.TokenFile = abs
	var x namedContext
	x.Name = "noderun"
	x.Context.Cluster, x.Context.User, x.Context.Namespace = "noderun", user, "default"
	cfg.Clusters, cfg.Users, cfg.Contexts = []namedCluster{c}, []namedUser{u}, []namedContext{x}
	return yaml.Marshal(&cfg)
}

func tokenFile(admin bool) string {
	if admin {
		return AdminTokenFile
	}
	return ViewTokenFile
}

// ClientCredentials reads what a client of the API needs from dir (the
// API's directory, CredentialsDir): TLS that trusts the API's CA, and the
// view token, or the admin token.
func ClientCredentials(dir string, admin bool) (*tls.Config, string, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, "", fmt.Errorf("the API's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, "", fmt.Errorf("the API's CA in %s holds no certificate", dir)
	}
	tok, err := os.ReadFile(filepath.Join(dir, tokenFile(admin)))
	if err != nil {
		return nil, "", fmt.Errorf("the API's token: %w", err)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, string(bytes.TrimSpace(tok)), nil
}

// ServerURL is the URL clients use for an API listening on addr (a
// listener's address): a wildcard address is reached through loopback.
func ServerURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "https://" + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return (&url.URL{Scheme: "https", Host: net.JoinHostPort(host, port)}).String()
}

package mirror

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"sigs.k8s.io/yaml"
)

// kubeconfig is the part of a kubeconfig file (clientcmd's v1 Config) the
// mirror reads: the current context's server, CA and credentials. The
// kubelet's kubelet.conf from kubeadm uses exactly these fields.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Clusters       []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server     string `json:"server"`
			CA         string `json:"certificate-authority"`
			CAData     []byte `json:"certificate-authority-data"`
			ServerName string `json:"tls-server-name"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Cert     string `json:"client-certificate"`
			CertData []byte `json:"client-certificate-data"`
			Key      string `json:"client-key"`
			KeyData  []byte `json:"client-key-data"`
			Token    string `json:"token"`
		} `json:"user"`
	} `json:"users"`
	Contexts []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
}

// connection is what a kubeconfig says: where the API server is and how
// to reach it.
type connection struct {
	server string
	token  string
	client *http.Client
}

// requestTimeout bounds every call, so that a hung API server only delays
// the mirror's next try.
const requestTimeout = 10 * time.Second

// loadKubeconfig reads path and makes a client for its current context.
// Relative file names are taken from path's directory, as clientcmd does;
// a client certificate given as a file is read again whenever the file
// changes (see certReloader).
func loadKubeconfig(path string) (*connection, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		ctxName = kc.Contexts[0].Name
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == ctxName {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: no context %q", path, ctxName)
	}
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	conn := &connection{}
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		conn.server, tlsCfg.ServerName = c.Cluster.Server, c.Cluster.ServerName
		ca := c.Cluster.CAData
		if c.Cluster.CA != "" {
			if ca, err = os.ReadFile(abs(c.Cluster.CA)); err != nil {
				return nil, fmt.Errorf("%s: cluster %q: %w", path, clusterName, err)
			}
		}
		if len(ca) > 0 {
			tlsCfg.RootCAs = x509.NewCertPool()
			if !tlsCfg.RootCAs.AppendCertsFromPEM(ca) {
				return nil, fmt.Errorf("%s: cluster %q: no PEM certificate in its certificate authority", path, clusterName)
			}
		}
	}
	if conn.server == "" {
		return nil, fmt.Errorf("%s: cluster %q: no server", path, clusterName)
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		conn.token = u.User.Token
		switch {
		case u.User.Cert != "" || u.User.Key != "":
			r := &certReloader{cert: abs(u.User.Cert), key: abs(u.User.Key)}
			if u.User.Key == "" {
				r.key = r.cert
			}
			if _, err := r.get(nil); err != nil {
				return nil, fmt.Errorf("%s: user %q: %w", path, userName, err)
			}
			tlsCfg.GetClientCertificate = r.get
		case len(u.User.CertData) > 0:
			cert, err := tls.X509KeyPair(u.User.CertData, u.User.KeyData)
			if err != nil {
				return nil, fmt.Errorf("%s: user %q: %w", path, userName, err)
			}
			tlsCfg.Certificates = []tls.Certificate{cert}
		}
	}
	conn.client = &http.Client{Timeout: requestTimeout, Transport: &http.Transport{
		TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment,
		TLSHandshakeTimeout: requestTimeout, IdleConnTimeout: time.Minute, MaxIdleConnsPerHost: 2,
	}}
	return conn, nil
}

// certReloader hands the TLS handshake the client certificate in its
// files, read again when either changed: the kubelet's certificate
// manager (and kubeadm's renewal) replaces kubelet-client-current.pem, a
// symlink, with a new certificate the API server will soon require.
type certReloader struct {
	cert, key string

	mu      sync.Mutex
	stamp   string
	current *tls.Certificate
}

func (r *certReloader) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	stamp := ""
	for _, p := range []string{r.cert, r.key} {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		stamp += fmt.Sprintf("%d/%d/", fi.ModTime().UnixNano(), fi.Size())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current != nil && stamp == r.stamp {
		return r.current, nil
	}
	cert, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		if r.current != nil {
			// Half written: keep using the last good pair until both match.
			return r.current, nil
		}
		return nil, errors.Join(fmt.Errorf("client certificate %s, key %s", r.cert, r.key), err)
	}
	r.current, r.stamp = &cert, stamp
	return r.current, nil
}

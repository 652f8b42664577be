package e2e

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/noderun/noderun/internal/testnode"
)

// ControlPlaneEnv names the Kubernetes versions the control-plane tests
// run (make test-controlplane): "v1.X.Y" or "v1.X.Y,v1.X.Z", the second
// the version kubeadm upgrades to. They build Kubernetes and etcd from
// their modules (testnode.BuildKube; cached), so they run only when asked.
const ControlPlaneEnv = "NODERUN_CONTROLPLANE"

// controlPlaneVersions returns the versions ControlPlaneEnv names, or
// skips the test.
func controlPlaneVersions(t *testing.T) (from, to string) {
	t.Helper()
	v := os.Getenv(ControlPlaneEnv)
	if v == "" {
		t.Skipf("%s=v1.X.Y[,v1.X.Z] runs the control-plane tests (make test-controlplane)", ControlPlaneEnv)
	}
	from, to, _ = strings.Cut(v, ",")
	return from, to
}

// pki is a certificate authority of a test's own, writing PEM files.
type pki struct {
	t    *testing.T
	dir  string
	ca   *x509.Certificate
	key  crypto.Signer
	next int64
}

func newPKI(t *testing.T, dir string) *pki {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{t: t, dir: dir, ca: ca, key: key, next: 2}
	p.write("ca.crt", "CERTIFICATE", der)
	return p
}

func (p *pki) write(name, typ string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// issue writes name.crt and name.key: a client certificate for cn in
// orgs, or with ips a serving one for those addresses.
func (p *pki) issue(name, cn string, orgs []string, ips ...net.IP) (cert, key string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	p.next++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.next), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if len(ips) > 0 {
		tmpl.ExtKeyUsage, tmpl.IPAddresses, tmpl.DNSNames = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, ips, []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.key)
	if err != nil {
		p.t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	pub, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	p.write(name+".pub", "PUBLIC KEY", pub) // what verifies service account tokens
	return p.write(name+".crt", "CERTIFICATE", der), p.write(name+".key", "EC PRIVATE KEY", kd)
}

// kubeconfig writes a kubeconfig for server with a client certificate.
func (p *pki) kubeconfig(name, server, cert, key string) string {
	path := filepath.Join(p.dir, name)
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
current-context: c
contexts:
- name: c
  context: {cluster: k, user: u}
clusters:
- name: k
  cluster: {server: %q, certificate-authority: %q}
users:
- name: u
  user: {client-certificate: %q, client-key: %q}
`, server, filepath.Join(p.dir, "ca.crt"), cert, key)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// apiServer is a real kube-apiserver on a real etcd, run as processes on
// loopback with the test's certificates: the Node authorizer and the
// NodeRestriction admission plugin on, as kubeadm sets them up, so that
// the node's credentials are held to what a kubelet's may do.
type apiServer struct {
	t          *testing.T
	dir, bin   string
	url        string
	port       int
	etcd, proc *testnode.Process
	admin      string // kubeconfig of system:masters
	etcdURL    string
	pki        *pki
}

func startAPIServer(t *testing.T, version, node string) *apiServer {
	t.Helper()
	ctx := context.Background()
	kdir, err := testnode.BuildKube(ctx, version, "kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	etcdVersion, err := testnode.KubeadmEtcdVersion(ctx, version)
	if err != nil {
		t.Fatal(err)
	}
	edir, err := testnode.BuildEtcd(ctx, etcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ports := freePorts(t, 3)
	a := &apiServer{t: t, dir: dir, bin: filepath.Join(kdir, "kube-apiserver"), port: ports[0], pki: newPKI(t, dir),
		url: "https://127.0.0.1:" + strconv.Itoa(ports[0]), etcdURL: "http://127.0.0.1:" + strconv.Itoa(ports[1])}
	a.etcd, err = testnode.Start(exec.Command(filepath.Join(edir, "etcd"), "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", a.etcdURL, "--advertise-client-urls", a.etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[2]), "--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(ports[2]),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(ports[2])), filepath.Join(dir, "etcd.out"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.etcd.Stop(10 * time.Second) })
	a.pki.issue("apiserver", "kube-apiserver", nil, net.ParseIP("127.0.0.1"))
	a.pki.issue("sa", "sa", nil) // only its key is used, to sign service account tokens
	cert, key := a.pki.issue("admin", "kubernetes-admin", []string{"system:masters"})
	a.admin = a.pki.kubeconfig("admin.conf", a.url, cert, key)
	a.start()
	t.Cleanup(func() { a.stop() })
	return a
}

// nodeKubeconfig writes the kubelet.conf of node: system:node:<node> in
// system:nodes, as kubeadm makes it.
func (a *apiServer) nodeKubeconfig(node string) string {
	cert, key := a.pki.issue("kubelet-client", "system:node:"+node, []string{"system:nodes"})
	return a.pki.kubeconfig("kubelet.conf", a.url, cert, key)
}

// start runs kube-apiserver and waits until /readyz answers ok.
func (a *apiServer) start() {
	t := a.t
	t.Helper()
	p := func(n string) string { return filepath.Join(a.dir, n) }
	var err error
	a.proc, err = testnode.Start(exec.Command(a.bin, "--etcd-servers", a.etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", strconv.Itoa(a.port),
		"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"), "--client-ca-file", p("ca.crt"),
		"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-cluster-ip-range", "10.96.0.0/24",
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction"), p("apiserver.out"), false)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(a.pki.ca)
	cert, key := p("admin.crt"), p("admin.key")
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}}
	deadline := time.Now().Add(3 * time.Minute) // a cold start on a busy machine; the bound is not the behaviour
	for {
		resp, err := client.Get(a.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if !a.proc.Running() || time.Now().After(deadline) {
			out, _ := os.ReadFile(p("apiserver.out"))
			t.Fatalf("kube-apiserver not ready (%v, running %v):\n%s", err, a.proc.Running(), tail(out))
		}
		time.Sleep(time.Second)
	}
}

func (a *apiServer) stop() {
	if a.proc != nil {
		a.proc.Stop(30 * time.Second)
	}
}

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// conformanceManifest reads one of the real-world manifests, unchanged.
func conformanceManifest(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "conformance", file))
	if err != nil {
		t.Fatal(err)
	}
	// The project's shared copy, when it is beside the repo, must not
	// have drifted from this one.
	if shared, err := os.ReadFile(filepath.Join("..", "..", "shared", "conformance", "manifests", file)); err == nil && string(shared) != string(b) {
		t.Errorf("testdata/conformance/%s differs from ../shared/conformance/manifests/%s", file, file)
	}
	return string(b)
}

// mainPID is the host PID of the container's first process.
func (n *node) mainPID(p *v1.Pod, container string) int {
	n.t.Helper()
	cs := containerStatus(p, container)
	id := strings.TrimPrefix(cs.ContainerID, "containerd://")
	return int(n.task(id).Pid)
}

// TestConformanceExecLiveness: the exec probe fails from 35 s, the third
// failure (~45 s) kills the container, whose sh ignores SIGTERM for the
// whole 30 s grace period: the first restart comes ~76 s after the start.
func TestConformanceExecLiveness(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("exec-liveness.yaml", conformanceManifest(t, "exec-liveness.yaml"))
	p := n.waitPodFor("liveness-exec", "restarted", 120*time.Second, func(p *v1.Pod) bool {
		return containerStatus(p, "liveness").RestartCount >= 1
	})
	cs := containerStatus(p, "liveness")
	last := cs.LastTerminationState.Terminated
	if cs.RestartCount != 1 || last == nil || last.Reason != "Error" || last.ExitCode != 137 {
		t.Fatalf("restartCount %d lastState %+v, want 1 and Error/137", cs.RestartCount, last)
	}
	ran := last.FinishedAt.Sub(last.StartedAt.Time)
	t.Logf("first run lasted %s (kubelet: ~75 s, restarted ~76 s after the start)", ran)
	// Killed at the third failure, then the whole grace period: by
	// noderun's record of the run, not by when the test looked. The upper
	// bound only says "then"; the count says which failure killed it.
	if ran < 70*time.Second || ran > 100*time.Second {
		t.Errorf("first run lasted %s, want ~75 s (probe fails at ~35/40/45 s, then 30 s grace)", ran)
	}
	evs := n.events("liveness-exec")
	if got := eventCount(evs, "Unhealthy", "Liveness probe failed:"); got != 3 {
		t.Errorf("%d Unhealthy liveness events, want 3 (failureThreshold):%s", got, eventsText(evs))
	}
	if !hasEvent(evs, "Unhealthy", "Liveness probe failed: cat: can't open '/tmp/healthy'") || !hasEvent(evs, "Killing", "Container liveness failed liveness probe") {
		t.Errorf("events: %+v", evs)
	}
}

// TestConformanceTCPLivenessReadiness: not Ready before the 15 s initial
// delay; Ready at the probe tick after it (~20 s); never restarted.
func TestConformanceTCPLivenessReadiness(t *testing.T) {
	t.Parallel()
	n := newNodeWithImages(t, []string{conformanceTar(t)})
	n.writeManifest("tcp-liveness-readiness.yaml", conformanceManifest(t, "tcp-liveness-readiness.yaml"))
	p := n.waitPod("goproxy", "running", running)
	started := containerStatus(p, "goproxy").State.Running.StartedAt.Time
	p = n.waitPodFor("goproxy", "Ready", 90*time.Second, func(p *v1.Pod) bool { return podCondition(p, v1.PodReady) })
	// By noderun's record, whole seconds (15 s or more is exact); the
	// upper bound only says "then".
	readyAt := condition(p, v1.PodReady).LastTransitionTime.Time
	t.Logf("Ready %s after the container started (kubelet: ~20 s)", readyAt.Sub(started))
	if after := readyAt.Sub(started); after < 15*time.Second || after > 45*time.Second {
		t.Errorf("Ready %s after the container started, want ~20 s (not before the 15 s initial delay)", after)
	}
	time.Sleep(12 * time.Second) // a liveness tick or more
	if cs := containerStatus(n.pod("goproxy"), "goproxy"); cs.RestartCount != 0 || !cs.Ready {
		t.Errorf("after the first liveness probes: restarts %d ready %t", cs.RestartCount, cs.Ready)
	}
}

// TestConformanceLifecycleEvents: postStart's file is there once the
// container is Running; on deletion preStop's `nginx -s quit` ends nginx
// gracefully before any SIGTERM.
func TestConformanceLifecycleEvents(t *testing.T) {
	t.Parallel()
	n := newNodeWithImages(t, []string{conformanceTar(t)})
	n.writeManifest("lifecycle-events.yaml", conformanceManifest(t, "lifecycle-events.yaml"))
	p := n.waitPod("lifecycle-demo", "running", running)
	pid := n.mainPID(p, "lifecycle-demo-container")
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/usr/share/message", pid))
	if err != nil || string(b) != "Hello from the postStart handler\n" {
		t.Fatalf("/usr/share/message when Running: %q, %v", b, err)
	}
	logPath := n.logPath(p, "lifecycle-demo-container", 0)
	n.waitLogLine(logPath, "nginx: started")
	n.removeManifest("lifecycle-events.yaml")
	// The log goes with the pod: keep what it said last.
	var lines []string
	for deadline := time.Now().Add(40 * time.Second); n.pod("lifecycle-demo") != nil; time.Sleep(pollEvery / 4) {
		if time.Now().After(deadline) {
			t.Fatal("pod not gone after 40s")
		}
		if ls := n.readLog(logPath); len(ls) > len(lines) {
			lines = lines[:0]
			for _, l := range ls {
				lines = append(lines, l.content)
			}
		}
	}
	if len(lines) < 2 || lines[len(lines)-1] != "nginx: quit by nginx -s quit" {
		t.Errorf("nginx log %q: want it ended by preStop's nginx -s quit, before the stop signal", lines)
	}
	// The hook still looped when nginx ended, so it is reported failed.
	if !hasEvent(n.events("lifecycle-demo"), "FailedPreStopHook", "") {
		t.Errorf("no FailedPreStopHook event (docs/operating.md lists it): %+v", n.events("lifecycle-demo"))
	}
}

// TestConformanceSharedVolume: the init container's page is served by web
// from its read-only mount of the shared emptyDir.
func TestConformanceSharedVolume(t *testing.T) {
	t.Parallel()
	n := newNodeWithImages(t, []string{conformanceTar(t)})
	n.writeManifest("shared-volume.yaml", conformanceManifest(t, "shared-volume.yaml"))
	p := n.waitPod("shared-volume-example", "running", running)
	if cs := containerStatus(p, "content-writer"); cs.State.Terminated == nil || cs.State.Terminated.Reason != "Completed" || !cs.Ready {
		t.Errorf("init container: %+v", cs)
	}
	if got := httpGet(t, "http://"+p.Status.PodIP+"/"); got != "Hello from the init container\n" {
		t.Errorf("web serves %q", got)
	}
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mounts", n.mainPID(p, "web")))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[1] == "/usr/share/nginx/html" && !strings.HasPrefix(f[3], "ro,") {
			t.Errorf("content mount is %s, want read-only", f[3])
		}
	}
}

// TestConformanceDownwardAPIEnv: the env names node, pod, namespace, IP and
// an empty service account.
func TestConformanceDownwardAPIEnv(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("dapi-envars-pod.yaml", conformanceManifest(t, "dapi-envars-pod.yaml"))
	p := n.waitPod("dapi-envars-fieldref", "running", running)
	path := n.logPath(p, "test-container", 0)
	n.waitLogLine(path, "dapi-envars-fieldref-"+nodeName)
	n.waitLogLine(path, p.Status.PodIP)
	var got []string
	for _, l := range n.readLog(path) {
		got = append(got, l.content)
	}
	// printenv prints each set variable; the empty service account is a line too.
	want := []string{"", nodeName, "dapi-envars-fieldref-" + nodeName, "default", p.Status.PodIP, ""}
	if len(got) < len(want) || strings.Join(got[:len(want)], "|") != strings.Join(want, "|") {
		t.Errorf("log %q, want it to begin %q", got, want)
	}
	if p.Spec.RestartPolicy != v1.RestartPolicyNever || p.Spec.ServiceAccountName != "" {
		t.Errorf("restartPolicy %s serviceAccountName %q", p.Spec.RestartPolicy, p.Spec.ServiceAccountName)
	}
}

// TestConformanceKubeadmEtcd: kubeadm's etcd static pod, accepted unchanged,
// runs with the address rewritten to loopback; its startup probe lets
// readiness through after ~11-25 s.
func TestConformanceKubeadmEtcd(t *testing.T) {
	t.Parallel()
	orig := conformanceManifest(t, "kubeadm-etcd.yaml")
	dir := t.TempDir()
	origPath := filepath.Join(dir, "etcd.yaml")
	if err := os.WriteFile(origPath, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	requireE2E(t)
	if out, err := exec.Command(noderunBin, "check", origPath).CombinedOutput(); err != nil {
		t.Fatalf("noderun check refused the manifest unchanged: %v\n%s", err, out)
	}
	for _, port := range []int{2379, 2380, 2381} {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d is taken on this host; the hostNetwork etcd needs it: %v", port, err)
		}
		l.Close()
	}
	certs, data := filepath.Join(dir, "pki"), filepath.Join(dir, "data")
	writeEtcdCerts(t, certs)
	m := strings.ReplaceAll(orig, "192.32.25.9", "127.0.0.1")
	m = strings.ReplaceAll(m, "path: /etc/kubernetes/pki/etcd", "path: "+certs)
	m = strings.ReplaceAll(m, "path: /var/lib/etcd-from-backup", "path: "+data)
	n := newNodeWithImages(t, []string{etcdTar(t)})
	n.writeManifest("etcd.yaml", m)
	p := n.waitPodFor("etcd", "running", 60*time.Second, running)
	started := containerStatus(p, "etcd").State.Running.StartedAt.Time
	p = n.waitPodFor("etcd", "Ready", 2*time.Minute, func(p *v1.Pod) bool { return podCondition(p, v1.PodReady) })
	// By noderun's record (whole seconds, so 10 s or more is exact), not
	// by when the test saw it. The upper bound only says "then": etcd
	// itself is slow to become healthy on a busy machine.
	after := condition(p, v1.PodReady).LastTransitionTime.Sub(started)
	t.Logf("etcd Ready %s after it started (kubelet: 11-25 s)", after)
	if after < 10*time.Second || after > time.Minute {
		t.Errorf("Ready %s after start, want ~11-25 s (startup probe after its 10 s initial delay, then readiness)", after)
	}
	cs := containerStatus(p, "etcd")
	if !*cs.Started || cs.RestartCount != 0 {
		t.Errorf("started %t restarts %d", *cs.Started, cs.RestartCount)
	}
	// A standalone kubelet has no Node object and reports no podIP for a
	// hostNetwork pod; noderun knows the node's address and reports it,
	// as a kubelet with a Node does (docs/differences.md).
	if p.Status.PodIP != p.Status.HostIP {
		t.Errorf("podIP %q, want the host IP %q", p.Status.PodIP, p.Status.HostIP)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.mainPID(p, "etcd")))
	if err != nil || !strings.Contains(string(status), "Seccomp:\t2") {
		t.Errorf("etcd is not under the RuntimeDefault seccomp filter: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, "member")); err != nil {
		t.Errorf("etcd wrote no data into its hostPath: %v", err)
	}
}

// writeEtcdCerts makes the CA and the server and peer certificates the
// kubeadm manifest names, for 127.0.0.1.
func writeEtcdCerts(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := newKey()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write("ca.crt", "CERTIFICATE", caDER)
	for i, name := range []string{"server", "peer"} {
		key := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: "controlplane"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost", "controlplane"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		write(name+".crt", "CERTIFICATE", der)
		write(name+".key", "EC PRIVATE KEY", keyDER)
	}
}

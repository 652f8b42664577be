package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
	"github.com/noderun/noderun/internal/testnode"
)

// kubeadmIgnored are the only preflight checks TestKubeadmControlPlane
// lets kubeadm ignore, each naming the kubelet binary: noderun is the
// node agent and there is no kubelet to run (`kubelet --version`).
var kubeadmIgnored = []string{"KubeletVersion"}

// controlPlane is one Kubernetes version's programs, built from their
// modules, and the images kubeadm expects them in.
type controlPlane struct {
	version, dir      string
	etcdVersion, etcd string // etcd's version (3.X.Y) and its directory
	pause             string // the pause image's tag kubeadm names
	images            string // OCI tarball of every image
}

func buildControlPlane(t *testing.T, version string) *controlPlane {
	t.Helper()
	ctx := context.Background()
	cp := &controlPlane{version: version}
	var err error
	if cp.dir, err = testnode.BuildKube(ctx, version, "kubeadm", "kube-apiserver", "kube-controller-manager", "kube-scheduler"); err != nil {
		t.Fatal(err)
	}
	if cp.etcdVersion, err = testnode.KubeadmEtcdVersion(ctx, version); err != nil {
		t.Fatal(err)
	}
	if cp.etcd, err = testnode.BuildEtcd(ctx, cp.etcdVersion); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(cp.dir, "kubeadm"), "config", "images", "list", "--kubernetes-version", version).Output()
	if err != nil {
		t.Fatalf("kubeadm config images list: %v", err)
	}
	cp.images = filepath.Join(t.TempDir(), "images-"+version+".tar")
	var imgs []ociimage.Image
	for _, name := range strings.Fields(string(out)) {
		imgs = append(imgs, cp.image(t, name))
	}
	if err := ociimage.WriteFile(cp.images, imgs...); err != nil {
		t.Fatal(err)
	}
	return cp
}

// image is the image kubeadm names: the program built from its module
// under /usr/local/bin for the control plane and etcd. The pause image
// (kubeadm checks it is there; noderun runs no pause container),
// kube-proxy and CoreDNS (the API server schedules their pods, which
// noderun does not run) are busybox under their names: nothing runs them
// here, which the test checks.
func (cp *controlPlane) image(t *testing.T, name string) ociimage.Image {
	repo, _, _ := strings.Cut(name[strings.LastIndex(name, "/")+1:], ":")
	bin := filepath.Join(cp.dir, repo)
	if repo == "etcd" {
		bin = filepath.Join(cp.etcd, "etcd")
	}
	if _, err := os.Stat(bin); err != nil {
		img, err := ociimage.Busybox(name)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return ociimage.Image{Name: name, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Files: map[string]ociimage.File{"/usr/local/bin/" + repo: ociimage.Regular(b, 0o755), "/tmp": ociimage.Dir(0o777 | os.ModeSticky)}}
}

// startCRIContainerd runs a containerd of the test's own with its CRI
// plugin on, for kubeadm: its preflight pulls (or finds) the images
// through CRI and its reset lists containers there. noderun uses the same
// containerd in its own namespace.
func startCRIContainerd(t *testing.T, tars ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "nrcri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "c.sock")
	conf := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\n[grpc]\n  address = %q\n"+
		"[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  conf_dir = %q\n", filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, filepath.Join(dir, "cni"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := testnode.Start(exec.Command("containerd", "--config", filepath.Join(dir, "config.toml")), filepath.Join(dir, "containerd.log"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(30 * time.Second) })
	deadline := time.Now().Add(time.Minute)
	for {
		if err := exec.Command("ctr", "-a", sock, "version").Run(); err == nil {
			break
		}
		if time.Now().After(deadline) || !p.Running() {
			t.Fatalf("containerd with CRI did not answer on %s", sock)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Where kubeadm's CRI calls look: the image pre-pull note of the README.
	for _, tar := range tars {
		if out, err := exec.Command("ctr", "-a", sock, "-n", "k8s.io", "images", "import", tar).CombinedOutput(); err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", tar, err, out)
		}
	}
	return sock
}

// kubeadmConfig writes kubeadm's configuration: the node's name and CRI
// socket, images used as they are (imagePullPolicy IfNotPresent: the
// test is offline) and the version.
func kubeadmConfig(t *testing.T, version, criSocket string) string {
	text := `apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
nodeRegistration:
  name: ` + nodeName + `
  criSocket: unix://` + criSocket + `
  imagePullPolicy: IfNotPresent
  ignorePreflightErrors: [` + strings.Join(kubeadmIgnored, ", ") + `]
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: ` + version + `
`
	path := filepath.Join(t.TempDir(), "kubeadm.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// kubeadm runs a kubeadm command, its output in the test log, and returns
// how long it took.
func kubeadm(t *testing.T, bin string, args ...string) time.Duration {
	t.Helper()
	start := time.Now()
	out, err := exec.Command(bin, args...).CombinedOutput()
	d := time.Since(start)
	t.Logf("kubeadm %s (%s):\n%s", strings.Join(args, " "), d.Round(time.Second), out)
	if err != nil {
		t.Fatalf("kubeadm %s: %v", args[0], err)
	}
	return d
}

// TestKubeadmControlPlane: kubeadm init brings up a whole control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) with
// noderun as the node agent, no phase skipped; kubeadm upgrade apply moves
// it to the next patch version through the mirror pods; kubeadm reset
// leaves the node clean. It runs on the host's /etc/kubernetes,
// /var/lib/etcd and ports as kubeadm does, so it refuses a host that has
// them in use.
func TestKubeadmControlPlane(t *testing.T) {
	from, to := controlPlaneVersions(t)
	requireE2E(t)
	for _, p := range []string{"/etc/kubernetes", "/var/lib/etcd", "/var/lib/kubelet"} {
		if ents, err := os.ReadDir(p); err == nil && len(ents) > 0 && p != "/etc/kubernetes" {
			t.Fatalf("%s is not empty: kubeadm would refuse it, and the test will not touch what is not its own", p)
		}
	}
	if _, err := os.Stat("/etc/kubernetes/admin.conf"); err == nil {
		t.Fatal("/etc/kubernetes holds a cluster: the test will not touch what is not its own")
	}
	cp := buildControlPlane(t, from)
	tars := []string{cp.images}
	var up *controlPlane
	if to != "" {
		up = buildControlPlane(t, to)
		tars = append(tars, up.images)
	}
	cri := startCRIContainerd(t, tars...)
	if err := os.MkdirAll("/etc/kubernetes/manifests", 0o755); err != nil {
		t.Fatal(err)
	}
	// The harness points noderun's proxy at a port nothing listens on, so
	// that no test reaches off the machine; kubeadm's API server listens
	// on the host's address, which the kubelet too reaches directly.
	out, err := exec.Command("ip", "-4", "route", "get", "1").Output()
	if f := strings.Fields(string(out)); err != nil || !slices.Contains(f, "src") {
		t.Fatalf("ip route get: %v %q", err, out)
	} else {
		t.Setenv("NO_PROXY", f[slices.Index(f, "src")+1])
	}
	n := newNodeWithImages(t, tars, "--containerd-address", cri, "--manifests", "/etc/kubernetes/manifests",
		"--kubeconfig", "/etc/kubernetes/kubelet.conf", "--healthz-port", "10248")
	t.Cleanup(func() {
		// Whatever failed: the host's kubeadm dirs go, and noderun stops the pods with their manifests.
		_ = exec.Command(filepath.Join(cp.dir, "kubeadm"), "reset", "-f", "--cri-socket", "unix://"+cri).Run()
	})

	initTime := kubeadm(t, filepath.Join(cp.dir, "kubeadm"), "init", "--config", kubeadmConfig(t, from, cri))
	admin := "/etc/kubernetes/admin.conf"
	if out := n.kubectlOK(admin, "get", "--raw", "/readyz"); out != "ok" {
		t.Errorf("/readyz: %q", out)
	}
	checkControlPlane(t, n, admin, cp)
	t.Logf("TIMING kubeadm init (to /readyz ok): %s", initTime.Round(time.Second))

	// A deleted mirror pod comes back; an edited manifest changes its hash.
	sched := "kube-scheduler-" + nodeName
	var before v1.Pod
	kubeGet(t, n, admin, &before, "-n", "kube-system", "pod", sched)
	n.kubectlOK(admin, "-n", "kube-system", "delete", "pod", sched, "--wait=false")
	waitAPI(t, "deleted mirror pod back", time.Minute, func() bool {
		var p v1.Pod
		return kubeGet(t, n, admin, &p, "-n", "kube-system", "pod", sched) && p.UID != before.UID && p.Status.Phase == v1.PodRunning
	})
	editManifest(t, "/etc/kubernetes/manifests/kube-scheduler.yaml", "    - --v=2\n")
	waitAPI(t, "mirror pod of the edited manifest", 2*time.Minute, func() bool {
		var p v1.Pod
		return kubeGet(t, n, admin, &p, "-n", "kube-system", "pod", sched) &&
			p.Annotations["kubernetes.io/config.hash"] != before.Annotations["kubernetes.io/config.hash"] && p.Status.Phase == v1.PodRunning
	})

	if up != nil {
		n.kubectlOK(admin, "-n", "default", "create", "configmap", "survives", "--from-literal=k=v")
		// CreateJob runs a Job's pod to prove the cluster schedules and runs
		// pods: nothing runs API pods on this node (noderun runs static pods).
		upTime := kubeadm(t, filepath.Join(up.dir, "kubeadm"), "upgrade", "apply", to, "-y", "--ignore-preflight-errors=CreateJob")
		checkControlPlane(t, n, admin, up)
		n.kubectlOK(admin, "-n", "default", "get", "configmap", "survives")
		t.Logf("TIMING kubeadm upgrade apply %s -> %s: %s", from, to, upTime.Round(time.Second))
	}

	last := up
	if last == nil {
		last = cp
	}
	kubeadm(t, filepath.Join(last.dir, "kubeadm"), "reset", "-f", "--cri-socket", "unix://"+cri)
	deadline := time.Now().Add(2 * time.Minute)
	for len(n.pods()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("pods left after kubeadm reset: %d", len(n.pods()))
		}
		time.Sleep(time.Second)
	}
	for _, p := range []string{"/etc/kubernetes/manifests", "/var/lib/etcd"} {
		if ents, _ := os.ReadDir(p); len(ents) > 0 {
			t.Errorf("%s not empty after reset: %v", p, ents)
		}
	}
}

// checkControlPlane checks what kubeadm's control plane of cp should be:
// the node Ready with kubeadm's control-plane label and taint (through the
// real kubectl), the four mirror pods Running and Ready, their containers
// made from cp's images, the API server answering at cp's version, and
// the pods the API server scheduled here not run.
func checkControlPlane(t *testing.T, n *node, admin string, cp *controlPlane) {
	t.Helper()
	var node v1.Node
	waitAPI(t, "node Ready", 2*time.Minute, func() bool { return kubeGet(t, n, admin, &node, "node", nodeName) && nodeReady(&node) })
	if _, ok := node.Labels["node-role.kubernetes.io/control-plane"]; !ok {
		t.Errorf("node labels %v: no node-role.kubernetes.io/control-plane", node.Labels)
	}
	tainted := false
	for _, taint := range node.Spec.Taints {
		tainted = tainted || taint.Key == "node-role.kubernetes.io/control-plane" && taint.Effect == v1.TaintEffectNoSchedule
	}
	if !tainted {
		t.Errorf("node taints %v: no node-role.kubernetes.io/control-plane:NoSchedule", node.Spec.Taints)
	}
	t.Log(n.kubectlOK(admin, "get", "nodes", "-o", "wide"))
	for _, c := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		name, tag := c+"-"+nodeName, ":"+cp.version
		if c == "etcd" {
			tag = ":" + cp.etcdVersion + "-0"
		}
		// The image the running container was made from, as noderun
		// reports it, not only the manifest's.
		waitAPI(t, name+" Running and Ready from an image tagged "+tag, 5*time.Minute, func() bool {
			var p v1.Pod
			if !kubeGet(t, n, admin, &p, "-n", "kube-system", "pod", name) || p.Status.Phase != v1.PodRunning ||
				len(p.Status.ContainerStatuses) != 1 || !strings.HasSuffix(p.Spec.Containers[0].Image, tag) {
				return false
			}
			cs := p.Status.ContainerStatuses[0]
			return cs.Ready && strings.HasSuffix(cs.Image, tag)
		})
	}
	var v struct{ GitVersion string }
	if err := json.Unmarshal([]byte(n.kubectlOK(admin, "get", "--raw", "/version")), &v); err != nil || v.GitVersion != cp.version {
		t.Errorf("the API server reports version %q (%v); want %s", v.GitVersion, err, cp.version)
	}
	// An upgrade's old pods are gone: one pod per component.
	waitAPI(t, "noderun running the four pods only", 2*time.Minute, func() bool { return len(n.pods()) == 4 })
	t.Log(n.kubectlOK(admin, "-n", "kube-system", "get", "pods", "-o",
		"custom-columns=NAME:.metadata.name,STATUS:.status.phase,IMAGE:.spec.containers[0].image,HASH:.metadata.annotations.kubernetes\\.io/config\\.hash"))
}

// editManifest adds line after the command's first line of a kubeadm
// manifest, as an operator's edit would.
func editManifest(t *testing.T, path, line string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "    - kube-scheduler\n")
	if i < 0 {
		t.Fatalf("%s: no kube-scheduler command line", path)
	}
	i += len("    - kube-scheduler\n")
	if err := os.WriteFile(path, []byte(s[:i]+line+s[i:]), 0o600); err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/cni"
	"github.com/noderun/noderun/runner"
)

// sleeper is a pod whose process exits at once on SIGTERM.
const sleeper = `trap 'exit 0' TERM; sleep 3600 & wait`

// gateway is the host's address on the node's bridge (host-local's first).
func (n *node) gateway() string {
	ip, _, err := net.ParseCIDR(n.subnet)
	if err != nil {
		n.t.Fatal(err)
	}
	ip = ip.To4()
	ip[3] = 1
	return ip.String()
}

// httpGet fetches url until it answers 200 or the deadline passes.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(waitTimeout)
	var last error
	for time.Now().Before(deadline) {
		resp, err := hc.Get(url)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
			err = fmt.Errorf("%s %v", resp.Status, rerr)
		}
		last = err
		time.Sleep(pollEvery)
	}
	t.Fatalf("GET %s: %v", url, last)
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func webPod(name, page string, hostPort int) string {
	ports := "[{containerPort: 8080}]"
	if hostPort > 0 {
		ports = fmt.Sprintf("[{containerPort: 8080, hostPort: %d}]", hostPort)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: busybox:1.36
    command: ["sh", "-c", "mkdir -p /www && echo %s > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: %s
`, name, page, ports)
}

// Two pods talk to each other by pod IP, the host reaches a pod IP, and a
// hostPort maps through to the pod.
func TestPodToPodAndHostPort(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	port := freePort(t)
	n.writeManifest("a.yaml", webPod("server", "from-server", port))
	a := n.waitPod("server", "Running", running)

	if got := httpGet(t, "http://"+a.Status.PodIP+":8080/"); got != "from-server\n" {
		t.Fatalf("host -> pod IP: %q", got)
	}
	if got := httpGet(t, fmt.Sprintf("http://%s:%d/", n.gateway(), port)); got != "from-server\n" {
		t.Fatalf("host -> hostPort %d: %q", port, got)
	}

	n.writeManifest("b.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  restartPolicy: OnFailure
  containers:
  - name: wget
    image: busybox:1.36
    # busybox-static's wget crashes in static glibc's resolver; nc does not.
    command: ["sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 %s 8080 | grep from-"]
`, a.Status.PodIP))
	b := n.waitPod("client", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if b.Status.PodIP == a.Status.PodIP || b.Status.PodIP == "" {
		t.Fatalf("client IP %q, server IP %q: want two distinct pod IPs", b.Status.PodIP, a.Status.PodIP)
	}
	restarts := b.Status.ContainerStatuses[0].RestartCount
	n.waitLogLine(n.logPath(b, "wget", int(restarts)), "from-server")
}

// The pod files follow dnsPolicy, dnsConfig, hostAliases, hostname and
// subdomain as the kubelet writes them.
func TestPodDNSAndHostsFiles(t *testing.T) {
	t.Parallel()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	hostResolv := "nameserver 192.0.2.53\nsearch corp.example\noptions ndots:2\n"
	if err := os.WriteFile(resolv, []byte("# host file\n"+hostResolv), 0o644); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, "--resolv-conf", resolv)
	show := `cat /etc/resolv.conf; echo ---; cat /etc/hostname; echo ---; grep -v '^#' /etc/hosts; echo ---; hostname; echo END`
	pod := func(name, extra string) string {
		return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  restartPolicy: Never
%s
  containers:
  - name: show
    image: busybox:1.36
    command: ["sh", "-c", %q]
`, name, extra, show)
	}
	n.writeManifest("default.yaml", pod("dns-default", "  dnsPolicy: Default\n  hostAliases: [{ip: 192.0.2.10, hostnames: [db, db.local]}]"))
	n.writeManifest("cluster.yaml", pod("dns-cluster", "  hostname: myhost\n  subdomain: sub"))
	n.writeManifest("none.yaml", pod("dns-none", `  dnsPolicy: None
  dnsConfig:
    nameservers: [192.0.2.54]
    searches: [a.local]
    options: [{name: ndots, value: "5"}, {name: edns0}]`))

	sections := func(name string) (*v1.Pod, []string) {
		p := n.waitPod(name, "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
		path := n.logPath(p, "show", 0)
		n.waitLogLine(path, "END")
		var lines []string
		for _, l := range n.readLog(path) {
			lines = append(lines, l.content)
		}
		return p, strings.Split(strings.Join(lines, "\n"), "\n---\n")
	}

	p, s := sections("dns-default")
	if s[0] != strings.TrimSuffix(hostResolv, "\n") {
		t.Errorf("Default resolv.conf:\n%s\nwant the host's:\n%s", s[0], hostResolv)
	}
	if s[1] != "dns-default-e2e" {
		t.Errorf("/etc/hostname %q, want the pod name", s[1])
	}
	for _, want := range []string{"127.0.0.1\tlocalhost", p.Status.PodIP + "\tdns-default-e2e", "192.0.2.10\tdb\tdb.local"} {
		if !strings.Contains(s[2], want) {
			t.Errorf("/etc/hosts lacks %q:\n%s", want, s[2])
		}
	}

	p, s = sections("dns-cluster")
	if s[0] != strings.TrimSuffix(hostResolv, "\n") {
		t.Errorf("ClusterFirst without cluster DNS must fall back to Default; got:\n%s", s[0])
	}
	if s[1] != "myhost" || !strings.HasPrefix(s[3], "myhost") {
		t.Errorf("hostname file %q, uname %q; want myhost", s[1], s[3])
	}
	if want := p.Status.PodIP + "\tmyhost.sub.default.svc.cluster.local\tmyhost"; !strings.Contains(s[2], want) {
		t.Errorf("/etc/hosts lacks %q:\n%s", want, s[2])
	}

	_, s = sections("dns-none")
	if want := "nameserver 192.0.2.54\nsearch a.local\noptions ndots:5 edns0"; s[0] != want {
		t.Errorf("None resolv.conf:\n%s\nwant:\n%s", s[0], want)
	}
}

// A hostNetwork pod sees the host's interfaces and makes no CNI call.
func TestHostNetworkPodSkipsCNI(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	before, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	n.writeManifest("host.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hostnet}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: links
    image: busybox:1.36
    command: ["sh", "-c", "ip -o link show; echo END"]
`)
	p := n.waitPod("hostnet", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	path := n.logPath(p, "links", 0)
	n.waitLogLine(path, "END")
	// Parallel tests add and remove veths: only interfaces that existed
	// all along must be seen.
	after, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	log := ""
	for _, l := range n.readLog(path) {
		log += l.content + "\n"
	}
	for _, i := range before {
		stayed := slices.ContainsFunc(after, func(a net.Interface) bool { return a.Index == i.Index && a.Name == i.Name })
		if stayed && !strings.Contains(log, fmt.Sprintf("%d: %s", i.Index, i.Name)) {
			t.Errorf("hostNetwork pod does not see host interface %d: %s:\n%s", i.Index, i.Name, log)
		}
	}
	if p.Status.PodIP != p.Status.HostIP {
		t.Errorf("podIP %q, want the hostIP %q", p.Status.PodIP, p.Status.HostIP)
	}
	if leases := n.leases(); len(leases) != 0 {
		t.Errorf("hostNetwork pod got IP leases %v", leases)
	}
	if cached := n.cniCache(); len(cached) != 0 {
		t.Errorf("hostNetwork pod has CNI cache entries %v: a CNI call was made", cached)
	}
	if _, err := os.Stat(filepath.Join(n.run, "pods", runner.SandboxID(string(p.UID)), "net")); !os.IsNotExist(err) {
		t.Errorf("hostNetwork pod has a pinned netns (stat: %v)", err)
	}
}

// leases lists host-local's allocations for the node's network.
func (n *node) leases() []string {
	ents, _ := os.ReadDir(filepath.Join(n.ipamDir(), n.netName))
	var out []string
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			out = append(out, e.Name())
		}
	}
	return out
}

func (n *node) cniCache() []string {
	ents, _ := os.ReadDir(filepath.Join(n.state, "cni", "cache", "results"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// netState counts what pods leave on the host: pinned sandboxes, veths on
// the bridge, IP leases, CNI cache entries and portmap rules.
type netState struct{ sandboxes, veths, leases, cache, portRules int }

func (n *node) netState() netState {
	n.t.Helper()
	sb, _ := os.ReadDir(filepath.Join(n.run, "pods"))
	out, err := exec.Command("ip", "-o", "link", "show", "master", n.bridge).Output()
	if err != nil {
		n.t.Fatalf("ip link: %v", err)
	}
	rules, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		n.t.Fatalf("iptables-save: %v", err)
	}
	return netState{
		sandboxes: len(sb),
		veths:     strings.Count(string(out), "\n"),
		leases:    len(n.leases()),
		cache:     len(n.cniCache()),
		portRules: strings.Count(string(rules), fmt.Sprintf(`name: \"%s\"`, n.netName)),
	}
}

// After a crash and a "reboot" (pinned namespaces and the run dir's sandbox
// files gone, containers killed), pods come back with working networking
// and nothing leaked.
func TestRebootKeepsNetworkingAndLeaksNothing(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("a.yaml", webPod("a", "page-a", 0))
	n.writeManifest("b.yaml", webPod("b", "page-b", freePort(t)))
	before := map[string]*v1.Pod{"a": n.waitPod("a", "Running", running), "b": n.waitPod("b", "Running", running)}
	want := n.netState()

	n.kill9()
	for _, p := range before {
		for _, c := range n.containers(string(p.UID)) {
			if task := n.task(c.ID); task != nil {
				_ = syscall.Kill(int(task.Pid), syscall.SIGKILL)
			}
		}
	}
	sandboxes, _ := filepath.Glob(filepath.Join(n.run, "pods", "*"))
	for _, dir := range sandboxes {
		if err := cni.RemoveNamespaces(dir, nil); err != nil {
			t.Fatal(err)
		}
		// The pod's /dev/shm and pod files tmpfs are gone after a reboot too.
		for _, m := range []string{"shm", "files"} {
			if err := unix.Unmount(filepath.Join(dir, m), unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	// So is the mount namespace that holds the pods' ipc and uts namespaces.
	for _, m := range []string{filepath.Join(n.run, "ns", "mnt"), filepath.Join(n.run, "ns")} {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
	n.start()

	for name, old := range before {
		p := n.waitPod(name, "Running after reboot", func(p *v1.Pod) bool {
			return running(p) && p.Status.ContainerStatuses[0].RestartCount >= 1
		})
		if p.UID != old.UID {
			t.Errorf("%s: UID changed across the reboot", name)
		}
		page := "page-" + name + "\n"
		if got := httpGet(t, "http://"+p.Status.PodIP+":8080/"); got != page {
			t.Errorf("%s after reboot: %q, want %q", name, got, page)
		}
	}
	deadline := time.Now().Add(waitTimeout)
	got := n.netState()
	for got != want && time.Now().Before(deadline) {
		time.Sleep(pollEvery)
		got = n.netState()
	}
	if got != want {
		t.Fatalf("after the reboot: %+v, want %+v as before (nothing leaked)", got, want)
	}
}

// Many create/delete cycles leave nothing behind but what running pods use.
func TestChurnLeaksNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("churn is long")
	}
	t.Parallel()
	n := newNode(t)
	n.writeManifest("keep.yaml", webPod("keep", "kept", freePort(t)))
	n.waitPod("keep", "Running", running)
	want := n.netState()
	// The counts must see the kept pod, or "nothing leaked" proves nothing.
	if want.sandboxes != 1 || want.veths != 1 || want.leases != 1 || want.cache != 1 || want.portRules == 0 {
		t.Fatalf("with one pod running: %+v; each count should see it", want)
	}

	const streams, cycles = 4, 50 // 200 create/delete cycles in all
	ports := make([]int, streams)
	for i := range ports {
		ports[i] = freePort(t)
	}
	if err := n.churnStreams(ports, cycles); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitTimeout)
	got := n.netState()
	for got != want && time.Now().Before(deadline) {
		time.Sleep(pollEvery)
		got = n.netState()
	}
	if got != want {
		t.Fatalf("after %d cycles: %+v, want %+v (only the kept pod)", streams*cycles, got, want)
	}
	if c := n.countContainers(); c != 1 {
		t.Fatalf("%d containers left, want 1", c)
	}
}

// churn creates and deletes one pod cycles times; it reports instead of
// failing because it runs on its own goroutine.
// churnStreams runs one churn per port, all at once, and returns their
// errors.
func (n *node) churnStreams(ports []int, cycles int) error {
	errs := make([]error, len(ports))
	var wg sync.WaitGroup
	for i, port := range ports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = n.churn(fmt.Sprintf("churn%d", i), port, cycles)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (n *node) churn(name string, hostPort, cycles int) error {
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  # A removal can come before sh has set its TERM trap; as PID 1 it then
  # ignores SIGTERM and only the grace period ends it.
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", %q]
    ports: [{containerPort: 80, hostPort: %d}]
`, name, sleeper, hostPort)
	file := filepath.Join(n.podsDir, name+".yaml")
	tmp := filepath.Join(n.podsDir, "."+name+".tmp")
	for i := range cycles {
		// The spec changes every cycle so every cycle is a new pod (UID).
		body := manifest + fmt.Sprintf("    env: [{name: CYCLE, value: %q}]\n", fmt.Sprint(i))
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, file); err != nil {
			return err
		}
		if !n.pollPod(name+"-e2e", func(p *v1.Pod) bool { return p != nil && running(p) }) {
			return fmt.Errorf("%s cycle %d: not Running", name, i)
		}
		if err := os.Remove(file); err != nil {
			return err
		}
		if !n.pollPod(name+"-e2e", func(p *v1.Pod) bool { return p == nil }) {
			return fmt.Errorf("%s cycle %d: not removed", name, i)
		}
	}
	return nil
}

// pollPod waits for cond on the named pod (nil when absent) without failing
// the test, for use off the test goroutine.
func (n *node) pollPod(name string, cond func(*v1.Pod) bool) bool {
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		var list v1.PodList
		if err := n.get("/pods", &list); err == nil {
			var p *v1.Pod
			for i := range list.Items {
				if list.Items[i].Name == name {
					p = &list.Items[i]
				}
			}
			if cond(p) {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// hostVeth finds the host side of the pod's veth: the link on the bridge
// whose peer index is the pod's eth0.
func (n *node) hostVeths() []string {
	out, err := exec.Command("ip", "-o", "link", "show", "master", n.bridge).Output()
	if err != nil {
		n.t.Fatalf("ip link: %v", err)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, name)
		}
	}
	return names
}

// Deleting a pod's veth under it is noticed at once (a netlink event, no
// polling) and repaired by recreating the sandbox; the pod serves again.
func TestDeletedVethIsRepaired(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("web.yaml", webPod("web", "repaired", 0))
	before := n.waitPod("web", "Running", running)
	veths := n.hostVeths()
	if len(veths) != 1 {
		t.Fatalf("veths on the bridge: %v, want one", veths)
	}
	if out, err := exec.Command("ip", "link", "del", veths[0]).CombinedOutput(); err != nil {
		t.Fatalf("ip link del: %v: %s", err, out)
	}
	p := n.waitPod("web", "restarted in a new sandbox", func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount == 1
	})
	if p.UID != before.UID {
		t.Fatalf("repair replaced the pod (UID %s, was %s); it must restart its containers in place", p.UID, before.UID)
	}
	if got := httpGet(t, "http://"+p.Status.PodIP+":8080/"); got != "repaired\n" {
		t.Fatalf("after repair: %q", got)
	}
	if s := n.netState(); s.veths != 1 || s.leases != 1 || s.sandboxes != 1 {
		t.Fatalf("after repair: %+v, want one of each", s)
	}
}

// With no usable CNI plugin, pods say why (NetworkNotReady) while
// hostNetwork pods run; installing the plugin lets the pod start.
func TestNetworkNotReadyThenFixed(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	for _, p := range []string{"host-local", "portmap", "bandwidth", "loopback"} { // no bridge
		if err := os.Symlink(filepath.Join(cniBinDir, p), filepath.Join(bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	n := newNode(t, "--cni-bin-dir", bin)
	n.writeManifest("web.yaml", webPod("web", "late", 0))
	n.writeManifest("host.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hostpod}
spec:
  hostNetwork: true
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
`)
	n.waitPod("hostpod", "Running", running)
	n.waitPod("web", "NetworkNotReady", func(p *v1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReadyToStartContainers && c.Reason == "NetworkNotReady" && strings.Contains(c.Message, `"bridge"`) {
				return p.Status.Phase == v1.PodPending
			}
		}
		return false
	})
	if err := os.Symlink(filepath.Join(cniBinDir, "bridge"), filepath.Join(bin, "bridge")); err != nil {
		t.Fatal(err)
	}
	p := n.waitPod("web", "Running once the plugin exists", running)
	if got := httpGet(t, "http://"+p.Status.PodIP+":8080/"); got != "late\n" {
		t.Fatalf("page %q", got)
	}
}

// The bandwidth annotations become a traffic shaper on the pod's veth.
func TestBandwidthAnnotations(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeCNIConfigWith(map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}})
	n.writeManifest("bw.yaml", `apiVersion: v1
kind: Pod
metadata:
  name: shaped
  annotations: {kubernetes.io/ingress-bandwidth: 1M, kubernetes.io/egress-bandwidth: 2M}
spec:
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
`)
	n.waitPod("shaped", "Running", running)
	veths := n.hostVeths()
	if len(veths) != 1 {
		t.Fatalf("veths %v", veths)
	}
	out, err := exec.Command("tc", "qdisc", "show", "dev", veths[0]).CombinedOutput()
	if err != nil {
		t.Fatalf("tc: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "rate 1Mbit") {
		t.Fatalf("no 1Mbit tbf on %s:\n%s", veths[0], out)
	}
}

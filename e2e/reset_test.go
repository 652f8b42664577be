package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestResetRestoresTheHost takes stock of the host before noderun first
// starts, runs pods with a hostPort, volumes and the default bridge network
// noderun writes itself, then `noderun reset --images`, and finds the host
// as it was.
//
// Other tests (of this suite and of other checkouts) run on this host at the
// same time and add their own mounts, links, iptables rules and cgroups, so
// the stock taken is only what can be this node's: mounts under its root
// dir or in its containerd namespace's task dirs; links that are its bridge
// or ports of it; iptables rules (all tables, counters stripped) that name
// its network, its subnet, its hostPort or a chain such a rule jumps to;
// cgroups of its own pods; files under its directories; its containerd
// namespace. Portmap's CNI-HOSTPORT-* chains and the jumps to them are
// shared by every CNI user on the host and never removed by the plugin, so
// noderun leaves them too; they name none of the above and are not
// compared. Nor are the shared containerd's empty
// io.containerd.runtime.v2.task/<namespace> dirs, which are containerd's.
func TestResetRestoresTheHost(t *testing.T) {
	n := prepareNode(t)
	n.extraArgs = []string{"--pod-bridge", n.bridge}
	port := freePort(t)
	chains := map[string]bool{} // the node's iptables chains, learnt while pods run
	w := watchLeaks(n, client)  // its pods, whose cgroups are looked for
	stock := func() hostState { return n.hostStock(w, port, chains) }
	before := stock()
	if len(before["links"]) != 0 {
		t.Fatalf("bridge %s exists before noderun starts: %v", n.bridge, before["links"])
	}

	n.start()
	hostDir := filepath.Join(n.root, "host")
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	n.writeManifest("web.yaml", webPod("web", "reset-page", port))
	n.writeManifest("vol.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: vol}
spec:
  terminationGracePeriodSeconds: 20
  containers:
  - name: c
    image: busybox:1.36
    command: ["sh", "-c", "trap 'sleep 2; echo graceful > /host/term; exit 0' TERM; echo up > /scratch/up; while :; do sleep 1; done"]
    volumeMounts: [{name: scratch, mountPath: /scratch}, {name: host, mountPath: /host}]
  volumes:
  - {name: scratch, emptyDir: {medium: Memory}}
  - {name: host, hostPath: {path: %s}}
`, hostDir))
	n.waitPod("web", "running", running)
	n.waitPod("vol", "running", running)
	if got := httpGet(t, fmt.Sprintf("http://%s:%d/", n.gateway(), port)); got != "reset-page\n" {
		t.Fatalf("hostPort serves %q", got)
	}

	during := stock()
	var counts []string
	for _, kind := range []string{"links", "iptables", "cgroups", "mounts", "files", "containerd namespace"} {
		if len(during[kind]) == 0 {
			t.Fatalf("while pods run, no %s of the node's found: the filter would prove nothing (%v)", kind, during)
		}
		counts = append(counts, fmt.Sprintf("%d %s", len(during[kind]), kind))
	}
	t.Logf("while pods run the node has: %s", strings.Join(counts, ", "))

	// The running daemon holds the lock: reset refuses and says why.
	out, err := exec.Command(noderunBin, append(n.flags(), "reset")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--force") {
		t.Fatalf("reset beside a running noderun: %v: %s; want a refusal naming --force", err, out)
	}

	n.stop() // pods keep running: reset must stop them itself
	start := time.Now()
	out, err = exec.Command(noderunBin, append(n.flags(), "reset", "--images")...).CombinedOutput()
	if err != nil {
		t.Fatalf("noderun reset: %v\n%s", err, out)
	}
	t.Logf("noderun reset took %s:\n%s", time.Since(start).Round(time.Millisecond), out)
	if b, err := os.ReadFile(filepath.Join(hostDir, "term")); err != nil || string(b) != "graceful\n" {
		t.Errorf("the vol pod's TERM handler did not finish (%q, %v): grace period not honoured", b, err)
	}
	if got := w.podCount(); got != 2 {
		t.Errorf("%d pods seen, want 2", got)
	}
	after := stock()
	if d := stockDiff(before, after); len(d) > 0 {
		t.Fatalf("the host differs from before noderun started:\n%s\nnoderun reset said:\n%s", strings.Join(d, "\n"), out)
	}
	// Reset again: nothing left to do, no error.
	if out, err := exec.Command(noderunBin, append(n.flags(), "reset", "--images")...).CombinedOutput(); err != nil {
		t.Fatalf("second reset: %v\n%s", err, out)
	}
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// hostStock is what of the host can be this node's (see
// TestResetRestoresTheHost). chains collects the iptables chains its rules
// jump to, so that their declarations and contents are compared too.
func (n *node) hostStock(w *leakWatch, hostPort int, chains map[string]bool) hostState {
	t := n.t
	t.Helper()
	s := hostState{}
	add := func(kind string, v ...string) { s[kind] = append(s[kind], v...) }

	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, fst := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(fst) < 1 {
			continue
		}
		if mp := f[4]; strings.HasPrefix(mp, n.root+"/") || strings.Contains(mp, "/"+n.ns+"/") {
			add("mounts", mp+" "+fst[0])
		}
	}

	links, err := exec.Command("ip", "-o", "link").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(links), "\n") {
		if f := strings.Fields(line); len(f) > 1 && (strings.TrimSuffix(f[1], ":") == n.bridge || slices.Contains(f, "master") && f[slices.Index(f, "master")+1] == n.bridge) {
			add("links", strings.TrimSuffix(f[1], ":"))
		}
	}

	ipt, err := exec.Command("iptables-save").Output()
	if err != nil {
		t.Fatal(err)
	}
	prefix := strings.TrimSuffix(n.subnet, "0/24")
	names := func(line string) bool {
		return strings.Contains(line, fmt.Sprintf(`name: \"%s\"`, n.netName)) || strings.Contains(line, " "+prefix) ||
			strings.Contains(line, fmt.Sprintf("--dport %d ", hostPort)) || strings.Contains(line, n.bridge)
	}
	var lines []string
	for _, line := range strings.Split(string(ipt), "\n") {
		if strings.HasPrefix(line, "#") {
			continue // generation time
		}
		line = counters.ReplaceAllString(line, "")
		lines = append(lines, line)
		if f := strings.Fields(line); names(line) && slices.Contains(f, "-j") {
			if j := f[slices.Index(f, "-j")+1]; strings.HasPrefix(j, "CNI-") && !strings.HasPrefix(j, "CNI-HOSTPORT-") || strings.HasPrefix(j, "NODERUN-") {
				chains[j] = true
			}
		}
	}
	for _, line := range lines {
		ours := names(line)
		for c := range chains {
			ours = ours || strings.Contains(line, c+" ") || strings.HasSuffix(line, c)
		}
		if ours {
			add("iptables", line)
		}
	}

	add("cgroups", w.cgroups()...)

	for _, dir := range []string{n.state, n.run, n.logs, n.cniConf, n.images} {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				add("files", p)
			}
			return nil
		})
	}
	nss, err := client.NamespaceService().List(n.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(nss, n.ns) {
		add("containerd namespace", n.ns)
	}
	for k := range s {
		slices.Sort(s[k])
		s[k] = slices.Compact(s[k])
	}
	return s
}

// stockDiff lists what is in one stock and not in the other.
func stockDiff(before, after hostState) []string {
	var out []string
	for _, l := range leaked(before, after) {
		out = append(out, "added   "+l)
	}
	for _, l := range leaked(after, before) {
		out = append(out, "removed "+l)
	}
	return out
}

// A managed containerd is noderun's: reset starts nothing new, removes the
// pod through it, then stops it and removes its directories.
func TestResetStopsTheManagedContainerd(t *testing.T) {
	n, pid := newManagedNode(t)
	n.writeManifest("p.yaml", sleeperPod("managed", "busybox:1.36", "managed"))
	p := n.waitPod("managed", "Running", running)
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	n.stop()
	out, err := exec.Command(noderunBin, append(n.flags(), "reset")...).CombinedOutput()
	if err != nil {
		t.Fatalf("noderun reset: %v\n%s", err, out)
	}
	if alive(pid) {
		t.Fatalf("managed containerd %d still runs after reset:\n%s", pid, out)
	}
	if shims := pgrep(id); shims > 0 {
		t.Errorf("the pod's shim (pid %d) still runs", shims)
	}
	for _, dir := range []string{n.state, n.run} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed", dir, err)
		}
	}
	if !strings.Contains(string(out), "stopped the managed containerd") {
		t.Errorf("reset does not say it stopped the managed containerd:\n%s", out)
	}
}

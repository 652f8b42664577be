package cni

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/atomicfile"
)

// testPod creates pinned namespaces for a pod and an Attachment for them,
// and registers their removal (DEL first) for the end of the test.
func testPod(t *testing.T, m *Manager, name string) Attachment {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	nss, err := CreateNamespaces(dir, name, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("nrt-%s-%08x", name, rand.Uint32())
	t.Cleanup(func() {
		// Runs last: whatever the test did, nothing may be left in the
		// host's iptables.
		if rules := natLines(t, id); len(rules) > 0 {
			t.Errorf("nat rules left for %s:\n%s", id, strings.Join(rules, "\n"))
			releaseNAT(context.Background(), func(o natOwner) bool { return o.id == id })
		}
	})
	t.Cleanup(func() {
		if err := RemoveNamespaces(dir, nil); err != nil {
			t.Error(err)
		}
	})
	a := Attachment{
		ID:           id,
		NetNS:        nss.Net,
		PodNamespace: "default",
		PodName:      name,
		PodUID:       fmt.Sprintf("uid-%08x", rand.Uint32()),
	}
	t.Cleanup(func() {
		if err := m.Del(context.Background(), a); err != nil {
			t.Error(err)
		}
	})
	return a
}

// leaseFile is where host-local records an allocated IP.
func leaseFile(cfg Config, network, ip string) string {
	return filepath.Join(filepath.Dir(cfg.CacheDir), "networks", network, ip)
}

// serveHello listens on all addresses inside the netns at nsPath and greets
// each connection.
func serveHello(t *testing.T, nsPath string) int {
	t.Helper()
	l := inNamespace(t, nsPath, unix.CLONE_NEWNET, func() (net.Listener, error) {
		return net.Listen("tcp4", "0.0.0.0:0")
	})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hello")
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func dialHello(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read from %s: %q, %v", addr, got, err)
	}
}

func TestAddDel(t *testing.T) {
	cfg, m := testManager(t)
	ctx := context.Background()
	a := testPod(t, m, "web")
	port := serveHello(t, a.NetNS)
	hostPort := 40000 + rand.IntN(10000)
	a.PortMappings = []PortMapping{{HostPort: hostPort, ContainerPort: port, Protocol: "TCP"}}

	ips, err := m.Add(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	_, subnet, _ := net.ParseCIDR(cfg.DefaultSubnet)
	if len(ips) != 1 || !subnet.Contains(net.ParseIP(ips[0])) {
		t.Fatalf("Add returned %v, want one IP in %s", ips, subnet)
	}
	lease := leaseFile(cfg, m.NetworkName(), ips[0])
	if _, err := os.Stat(lease); err != nil {
		t.Errorf("no host-local lease: %v", err)
	}

	dialHello(t, net.JoinHostPort(ips[0], strconv.Itoa(port)))
	// The hostPort, via the bridge's own (gateway) address on the host.
	gw := subnet.IP.To4()
	gw[3]++
	dialHello(t, net.JoinHostPort(gw.String(), strconv.Itoa(hostPort)))

	if err := m.Del(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lease); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lease %s not released (stat: %v)", lease, err)
	}
	if err := m.Del(ctx, a); err != nil {
		t.Errorf("second Del: %v", err)
	}
}

func TestAddTwoPods(t *testing.T) {
	requirePlugins(t)
	m, err := New(testNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ips1, err := m.Add(ctx, testPod(t, m, "one"))
	if err != nil {
		t.Fatal(err)
	}
	ips2, err := m.Add(ctx, testPod(t, m, "two"))
	if err != nil {
		t.Fatal(err)
	}
	if ips1[0] == ips2[0] {
		t.Errorf("both pods got %s", ips1[0])
	}
}

func TestDelAfterNetnsGone(t *testing.T) {
	requirePlugins(t)
	tests := []struct {
		name  string
		netns func(a Attachment) string
	}{
		{name: "empty path", netns: func(Attachment) string { return "" }},
		{name: "stale path", netns: func(a Attachment) string { return a.NetNS }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testNetwork(t)
			perPodMasquerade(t, cfg)
			m, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			a := testPod(t, m, "gone")
			ips, err := m.Add(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			if len(natLines(t, a.ID)) == 0 {
				t.Fatal("no masquerade rules after ADD; the test proves nothing")
			}
			// As after a reboot or a teardown that removed the sandbox first.
			if err := RemoveNamespaces(filepath.Dir(a.NetNS), nil); err != nil {
				t.Fatal(err)
			}
			a.NetNS = tt.netns(a)
			if err := m.Del(ctx, a); err != nil {
				t.Fatal(err)
			}
			lease := leaseFile(cfg, m.NetworkName(), ips[0])
			if _, err := os.Stat(lease); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("lease %s not released (stat: %v)", lease, err)
			}
			// The bridge plugin cannot find them without the netns.
			if rules := natLines(t, a.ID); len(rules) > 0 {
				t.Errorf("masquerade rules left:\n%s", strings.Join(rules, "\n"))
			}
		})
	}
}

// TestAddRollsBack makes a plugin fail after bridge and host-local have
// allocated, and checks Add releases the IP and its rollback succeeds.
func TestAddRollsBack(t *testing.T) {
	requirePlugins(t)
	tests := []struct {
		name  string
		setup func(t *testing.T, cfg Config)
		conf  string // a conflist; %[1]q bridge, %[2]q subnet, %[3]q dataDir
	}{
		{
			name: "last plugin fails",
			conf: `{"cniVersion":"1.0.0","name":"rollback","plugins":[
				{"type":"bridge","bridge":%[1]q,"isGateway":true,
				 "ipam":{"type":"host-local","ranges":[[{"subnet":%[2]q}]],"dataDir":%[3]q}},
				{"type":"tuning","sysctl":{"net.ipv4.conf.eth0.nrt_no_such_sysctl":"1"}}]}`,
		},
		{
			// bridge fails after configuring the pod's eth0, before its
			// masquerade rules, so its first DEL fails to remove them.
			name: "bridge fails midway",
			setup: func(t *testing.T, cfg Config) {
				_, subnet, _ := net.ParseCIDR(cfg.DefaultSubnet)
				other := subnet.IP.To4()
				other[3] = 254
				run(t, "ip", "link", "add", "name", cfg.DefaultBridge, "type", "bridge")
				run(t, "ip", "addr", "add", other.String()+"/24", "dev", cfg.DefaultBridge)
			},
			conf: `{"cniVersion":"1.0.0","name":"rollback","plugins":[
				{"type":"bridge","bridge":%[1]q,"isGateway":true,"ipMasq":true,
				 "ipam":{"type":"host-local","ranges":[[{"subnet":%[2]q}]],"dataDir":%[3]q}}]}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testNetwork(t)
			if tt.setup != nil {
				tt.setup(t, cfg)
			}
			dataDir := filepath.Join(filepath.Dir(cfg.CacheDir), "networks")
			conf := fmt.Sprintf(tt.conf, cfg.DefaultBridge, cfg.DefaultSubnet, dataDir)
			writeFiles(t, cfg.ConfDir, map[string]string{"10-rollback.conflist": conf})
			m, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}

			_, err = m.Add(context.Background(), testPod(t, m, "fail"))
			if err == nil {
				t.Fatal("Add succeeded despite a failing plugin")
			}
			t.Logf("Add failed as intended: %v", err)
			if strings.Contains(err.Error(), "rollback: ") {
				t.Errorf("rollback failed: %v", err)
			}
			entries, err := os.ReadDir(filepath.Join(dataDir, "rollback"))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				// host-local keeps a last_reserved_ip and a lock file; a
				// lease is named after the IP.
				if net.ParseIP(e.Name()) != nil {
					t.Errorf("lease %s left after a failed Add", e.Name())
				}
			}
		})
	}
}

// natLines returns the nat rules of iptables and ip6tables whose comment
// names id.
func natLines(t *testing.T, id string) []string {
	t.Helper()
	var lines []string
	for _, bin := range []string{"iptables", "ip6tables"} {
		out, err := exec.Command(bin, "-w", "-t", "nat", "-S").Output()
		if err != nil {
			t.Fatalf("%s -t nat -S: %v", bin, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, fmt.Sprintf(`id: \"%s\"`, id)) {
				lines = append(lines, bin+": "+l)
			}
		}
	}
	return lines
}

// hostVeth returns the host side of the pod's veth, from the cached result.
func hostVeth(t *testing.T, m *Manager, a Attachment) string {
	t.Helper()
	res, err := m.cni.GetNetworkListCachedResult(m.lastList(), runtimeConf(a))
	if err != nil || res == nil {
		t.Fatalf("no cached result for %s: %v", a.ID, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && strings.HasPrefix(i.Name, "veth") {
			return i.Name
		}
	}
	t.Fatalf("no host veth in %v", r.Interfaces)
	return ""
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// TestNotReadyUntilPluginInstalled starts with the bridge plugin missing
// from the only bin dir, then installs it.
func TestNotReadyUntilPluginInstalled(t *testing.T) {
	requirePlugins(t)
	cfg := testNetwork(t)
	binDir := t.TempDir()
	entries, err := os.ReadDir(pluginDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "bridge" {
			if err := os.Symlink(filepath.Join(pluginDir, e.Name()), filepath.Join(binDir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg.BinDirs = []string{binDir}
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New with a plugin missing: %v", err)
	}
	err = m.Ready()
	if !errors.Is(err, ErrNetworkNotReady) || !errors.Is(err, ErrPluginNotFound) ||
		!strings.Contains(err.Error(), `"bridge"`) || !strings.Contains(err.Error(), defaultConfName) {
		t.Fatalf("Ready() = %v, want ErrNetworkNotReady and ErrPluginNotFound naming bridge and the file", err)
	}
	ctx := context.Background()
	a := testPod(t, m, "late")
	if _, err := m.Add(ctx, a); !errors.Is(err, ErrNetworkNotReady) {
		t.Fatalf("Add() = %v, want ErrNetworkNotReady", err)
	}

	if err := os.Symlink(filepath.Join(pluginDir, "bridge"), filepath.Join(binDir, "bridge")); err != nil {
		t.Fatal(err)
	}
	if err := m.Ready(); err != nil {
		t.Fatalf("Ready() after installing bridge: %v", err)
	}
	if _, err := m.Add(ctx, a); err != nil {
		t.Fatal(err)
	}
}

// TestReloadNewSubnet changes the subnet in the config file between two
// pods: the second gets an IP in the new one, and the first is still
// released with the config cached at its ADD.
func TestReloadNewSubnet(t *testing.T) {
	requirePlugins(t)
	cfg := testNetwork(t)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a1 := testPod(t, m, "before")
	ips1, err := m.Add(ctx, a1)
	if err != nil {
		t.Fatal(err)
	}

	// A new bridge too: the bridge plugin keeps one subnet per bridge.
	bridge2, subnet2 := freeBridgeAndSubnet(t)
	for subnet2 == cfg.DefaultSubnet {
		bridge2, subnet2 = freeBridgeAndSubnet(t)
	}
	deleteBridgeAtEnd(t, bridge2)
	path := filepath.Join(cfg.ConfDir, defaultConfName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(string(data), cfg.DefaultSubnet, subnet2, 1)
	conf = strings.Replace(conf, fmt.Sprintf(`"bridge": %q`, cfg.DefaultBridge), fmt.Sprintf(`"bridge": %q`, bridge2), 1)
	if err := atomicfile.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}

	ips2, err := m.Add(ctx, testPod(t, m, "after"))
	if err != nil {
		t.Fatal(err)
	}
	if _, n, _ := net.ParseCIDR(subnet2); !n.Contains(net.ParseIP(ips2[0])) {
		t.Errorf("pod added after the change got %v, want an IP in %s", ips2, subnet2)
	}
	if err := m.Del(ctx, a1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leaseFile(cfg, m.NetworkName(), ips1[0])); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lease of %s not released (stat: %v)", ips1[0], err)
	}
}

// TestBandwidth checks that the default config's bandwidth plugin shapes
// a pod's traffic with tbf qdiscs as ParseBandwidth asks, and that CHECK
// accepts them.
func TestBandwidth(t *testing.T) {
	requirePlugins(t)
	_, err := exec.LookPath("tc")
	require(t, err == nil, "tc in PATH")
	cfg := testNetwork(t)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	limited := testPod(t, m, "limited")
	if limited.Bandwidth, err = ParseBandwidth("1M", "2M"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Add(ctx, limited); err != nil {
		t.Fatal(err)
	}
	free := testPod(t, m, "free")
	if _, err := m.Add(ctx, free); err != nil {
		t.Fatal(err)
	}

	// Ingress is shaped on the host's veth, egress on an ifb device the
	// plugin names after the network and ID (as the bridge plugin names its
	// chains).
	ingress := run(t, "tc", "qdisc", "show", "dev", hostVeth(t, m, limited))
	if !strings.Contains(ingress, "tbf") || !strings.Contains(ingress, "rate 1Mbit") {
		t.Errorf("host veth qdiscs lack a 1Mbit tbf:\n%s", ingress)
	}
	ifb := fmt.Sprintf("bwp%x", sha512.Sum512([]byte(m.NetworkName()+limited.ID)))[:15]
	egress := run(t, "tc", "qdisc", "show", "dev", ifb)
	if !strings.Contains(egress, "tbf") || !strings.Contains(egress, "rate 2Mbit") {
		t.Errorf("%s qdiscs lack a 2Mbit tbf:\n%s", ifb, egress)
	}
	if q := run(t, "tc", "qdisc", "show", "dev", hostVeth(t, m, free)); strings.Contains(q, "tbf") {
		t.Errorf("pod without limits is shaped:\n%s", q)
	}
	if err := m.Check(ctx, limited); err != nil {
		t.Errorf("Check: %v", err)
	}

	if err := m.Del(ctx, limited); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(ifb); err == nil {
		t.Errorf("%s left after Del", ifb)
	}
}

// TestCheckVethDeleted breaks a healthy pod's network the way an admin or
// a crashing agent might: by deleting its veth.
func TestCheckVethDeleted(t *testing.T) {
	requirePlugins(t)
	tests := []struct {
		name  string
		setup func(a *Attachment)
	}{
		{name: "plain"},
		{name: "hostPort and limits", setup: func(a *Attachment) {
			a.PortMappings = []PortMapping{{HostPort: 40000 + rand.IntN(10000), ContainerPort: 80}}
			a.Bandwidth = &Bandwidth{IngressRate: 1e6, IngressBurst: defaultBurst}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(testNetwork(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			a := testPod(t, m, "check")
			if tt.setup != nil {
				tt.setup(&a)
			}
			if _, err := m.Add(ctx, a); err != nil {
				t.Fatal(err)
			}
			if err := m.Check(ctx, a); err != nil {
				t.Fatalf("Check of a healthy pod: %v", err)
			}
			run(t, "ip", "link", "del", hostVeth(t, m, a))
			err = m.Check(ctx, a)
			if !errors.Is(err, ErrCheckFailed) {
				t.Fatalf("Check after deleting the veth = %v, want ErrCheckFailed", err)
			}
			t.Logf("Check failed as intended: %v", err)
			// What a caller does with a broken attachment: release it by
			// ID, without the netns (the test's cleanup then finds no NAT
			// rules left, or fails).
			gone := a
			gone.NetNS = ""
			if err := m.Del(ctx, gone); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A DEL with the pod's netns alive leaves the masquerade rules to the bridge
// plugin and lists no iptables rules itself.
func TestDelWithLiveNetnsLeavesNoRules(t *testing.T) {
	_, m := testManager(t, perPodMasquerade)
	ctx := context.Background()
	a := testPod(t, m, "live")
	if _, err := m.Add(ctx, a); err != nil {
		t.Fatal(err)
	}
	if len(natLines(t, a.ID)) == 0 {
		t.Fatal("no masquerade rules after ADD; the test proves nothing")
	}
	if err := m.Del(ctx, a); err != nil {
		t.Fatal(err)
	}
	if rules := natLines(t, a.ID); len(rules) > 0 {
		t.Fatalf("rules left after DEL:\n%s", strings.Join(rules, "\n"))
	}
}

// A netns whose pin is gone but that something still holds open (a stray
// process, another tool's fd) keeps the pod's veth pair alive: DEL without
// the netns cannot reach it, so the host end named in the cached result
// is removed directly rather than left on the bridge with the old address.
func TestDelRemovesHostVethOfAHeldNetns(t *testing.T) {
	requirePlugins(t)
	m, err := New(testNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a := testPod(t, m, "held")
	if _, err := m.Add(ctx, a); err != nil {
		t.Fatal(err)
	}
	veth := hostVeth(t, m, a)
	held, err := os.Open(a.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := RemoveNamespaces(filepath.Dir(a.NetNS), nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Del(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(veth); err == nil {
		t.Fatalf("host veth %s left on the bridge after DEL", veth)
	}
}

// A noderun killed during an ADD leaves its plugins running. The ADD redone
// at the next start waits for them, releases what they made and attaches
// afresh: the pod keeps its lease, and after the DEL no rule or lease of it
// is left. Here the bridge plugin of the unfinished ADD is still asleep when
// the ADD is redone.
func TestAddAfterAnUnfinishedAdd(t *testing.T) {
	cfg, m := testManager(t)
	ctx := context.Background()
	a := testPod(t, m, "unfinished")
	list, _, err := m.refresh()
	if err != nil {
		t.Fatal(err)
	}
	// What the killed noderun had done: recorded the ID, started bridge.
	if err := m.owned.add(list.Name, a.ID); err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &conf); err != nil || conf["type"] != "bridge" {
		t.Fatalf("first plugin %s (%v), want bridge", list.Plugins[0].Bytes, err)
	}
	conf["name"], conf["cniVersion"] = list.Name, list.CNIVersion
	stdin, _ := json.Marshal(conf)
	orphan := exec.Command("sh", "-c", "sleep 1; exec "+filepath.Join(pluginDir, "bridge"))
	orphan.Stdin = bytes.NewReader(stdin)
	orphan.Env = append(os.Environ(), "CNI_COMMAND=ADD", "CNI_CONTAINERID="+a.ID, "CNI_NETNS="+a.NetNS,
		"CNI_IFNAME=eth0", "CNI_PATH="+pluginDir)
	var out bytes.Buffer
	orphan.Stdout = &out
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	orphanDone := make(chan error, 1)
	go func() { orphanDone <- orphan.Wait() }()

	ips, err := m.Add(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-orphanDone:
		if err != nil || !strings.Contains(out.String(), `"ips"`) {
			t.Fatalf("the unfinished ADD's plugin: %v: %s", err, out.String())
		}
	default:
		t.Fatal("Add returned while the unfinished ADD's plugin still ran")
	}
	lease := leaseFile(cfg, m.NetworkName(), ips[0])
	if _, err := os.Stat(lease); err != nil {
		t.Fatalf("the pod's lease %s: %v", lease, err)
	}
	leases, _ := filepath.Glob(filepath.Join(filepath.Dir(lease), "10.*"))
	if len(leases) != 1 {
		t.Errorf("leases %v, want the pod's one", leases)
	}
	if err := m.Del(ctx, a); err != nil {
		t.Fatal(err)
	}
	if rules := natLines(t, a.ID); len(rules) > 0 {
		t.Fatalf("rules left after DEL:\n%s", strings.Join(rules, "\n"))
	}
	if _, err := os.Stat(lease); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("lease %s not released (stat: %v)", lease, err)
	}
}

package cni

import (
	"context"
	"crypto/sha512"
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
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testPod creates pinned namespaces for a pod and an Attachment for them,
// and registers their removal (DEL first) for the end of the test.
func testPod(t *testing.T, m *Manager, name string) Attachment {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	nss, err := CreateNamespaces(dir, name, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := RemoveNamespaces(dir); err != nil {
			t.Error(err)
		}
	})
	a := Attachment{
		ID:           fmt.Sprintf("nrt-%s-%08x", name, rand.Uint32()),
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
	c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read from %s: %q, %v", addr, got, err)
	}
}

func TestAddDel(t *testing.T) {
	requirePlugins(t)
	cfg := testNetwork(t)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
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
			dropMasquerade(t, m.NetworkName(), a.ID, ips[0])
			// As after a reboot or a teardown that removed the sandbox first.
			if err := RemoveNamespaces(filepath.Dir(a.NetNS)); err != nil {
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
		})
	}
}

// dropMasquerade removes, when the test ends, the masquerade rules the bridge
// plugin made for the pod: its DEL cannot once the pod's interface is gone,
// which after a reboot does not matter but here would leak into the host.
func dropMasquerade(t *testing.T, network, id, ip string) {
	t.Cleanup(func() {
		// The bridge plugin's names, from plugins/pkg/utils.
		chain := fmt.Sprintf("CNI-%x", sha512.Sum512([]byte(network+id)))[:28]
		comment := fmt.Sprintf("name: %q id: %q", network, id)
		for _, args := range [][]string{
			{"-D", "POSTROUTING", "-s", ip + "/32", "-m", "comment", "--comment", comment, "-j", chain},
			{"-F", chain},
			{"-X", chain},
		} {
			args = append([]string{"-w", "-t", "nat"}, args...)
			if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
				t.Errorf("iptables %v: %v: %s", args, err, out)
			}
		}
	})
}

// TestAddRollsBack makes the last plugin of the chain fail after bridge and
// host-local have allocated, and checks Add releases the IP.
func TestAddRollsBack(t *testing.T) {
	requirePlugins(t)
	cfg := testNetwork(t)
	dataDir := filepath.Join(filepath.Dir(cfg.CacheDir), "networks")
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"rollback","plugins":[
		{"type":"bridge","bridge":%q,"isGateway":true,
		 "ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}},
		{"type":"tuning","sysctl":{"net.ipv4.conf.eth0.nrt_no_such_sysctl":"1"}}]}`,
		cfg.DefaultBridge, cfg.DefaultSubnet, dataDir)
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
	entries, err := os.ReadDir(filepath.Join(dataDir, "rollback"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		// host-local keeps a last_reserved_ip and a lock file; a lease is
		// named after the IP.
		if net.ParseIP(e.Name()) != nil {
			t.Errorf("lease %s left after a failed Add", e.Name())
		}
	}
}

package cni

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/noderun/noderun/internal/testenv"
)

const pluginDir = "/usr/lib/cni"

var require = testenv.Require

// requireRoot is for tests that create namespaces and mounts.
func requireRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root and real namespaces; skipped with -short")
	}
	require(t, os.Geteuid() == 0, "root")
}

// requirePlugins is for tests that run the real plugins of the default
// config, which also need iptables for ipMasq and portmap.
func requirePlugins(t *testing.T) {
	t.Helper()
	requireRoot(t)
	for _, p := range []string{"bridge", "host-local", "portmap", "bandwidth", "loopback", "tuning"} {
		_, err := os.Stat(filepath.Join(pluginDir, p))
		require(t, err == nil, "CNI plugin "+filepath.Join(pluginDir, p))
	}
	_, err := exec.LookPath("iptables")
	require(t, err == nil, "iptables in PATH")
}

// testNetwork returns a Config with private dirs and a bridge and subnet no
// other test (of any package) is likely to use, and deletes the bridge when
// the test ends.
func testNetwork(t *testing.T) Config {
	t.Helper()
	bridge, subnet := freeBridgeAndSubnet(t)
	deleteBridgeAtEnd(t, bridge)
	t.Cleanup(func() {
		if err := RemoveMasquerade(context.Background(), defaultNetworkName(bridge)); err != nil {
			t.Error(err)
		}
	})
	dir := t.TempDir()
	return Config{
		ConfDir:       filepath.Join(dir, "net.d"),
		BinDirs:       []string{pluginDir},
		CacheDir:      filepath.Join(dir, "cni", "cache"),
		DefaultSubnet: subnet,
		DefaultBridge: bridge,
		Logger:        testLogger(t),
	}
}

// testManager returns a Manager on a fresh test network (testNetwork), once
// setup wrote what its ConfDir is to hold.
func testManager(t *testing.T, setup ...func(*testing.T, Config)) (Config, *Manager) {
	t.Helper()
	requirePlugins(t)
	cfg := testNetwork(t)
	for _, f := range setup {
		f(t, cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, m
}

// deleteBridgeAtEnd deletes the bridge, if the plugins made it, when the
// test ends.
func deleteBridgeAtEnd(t *testing.T, bridge string) {
	t.Cleanup(func() {
		if _, err := net.InterfaceByName(bridge); err != nil {
			return
		}
		if out, err := exec.Command("ip", "link", "del", bridge).CombinedOutput(); err != nil {
			t.Errorf("ip link del %s: %v: %s", bridge, err, out)
		}
	})
}

func freeBridgeAndSubnet(t *testing.T) (string, string) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		bridge := fmt.Sprintf("nrt%04x", rand.IntN(0x10000))
		_, subnet, _ := net.ParseCIDR(fmt.Sprintf("10.200.%d.0/24", rand.IntN(256)))
		if _, err := net.InterfaceByName(bridge); err == nil {
			continue
		}
		if overlaps(subnet, addrs) {
			continue
		}
		return bridge, subnet.String()
	}
	t.Fatal("no free bridge name and subnet")
	return "", ""
}

func overlaps(subnet *net.IPNet, addrs []net.Addr) bool {
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && (subnet.Contains(ipn.IP) || ipn.Contains(subnet.IP)) {
			return true
		}
	}
	return false
}

// inNamespace runs fn on a thread that has joined the namespace pinned at
// path. The thread is left locked so it dies rather than carry the pod's
// namespace into other goroutines.
func inNamespace[T any](t *testing.T, path string, nstype int, fn func() (T, error)) T {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, nstype); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", path, err)}
			return
		}
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.v
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

package cni

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// perPodMasquerade makes cfg's network a user's copy of the default config
// (one byte more), which runs whole: the bridge plugin then makes each
// pod's masquerade rules, which the tests of their cleanup need.
func perPodMasquerade(t *testing.T, cfg Config) {
	t.Helper()
	data, err := DefaultConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, cfg.ConfDir, map[string]string{defaultConfName: string(data) + "\n"})
}

// The pods of noderun's own default network are masqueraded by the
// node-wide rules: the bridge plugin makes none of its own, a connection
// from a pod to an address beyond the host arrives from the host's address
// (unmasqueraded it could not even be answered: nothing there routes the
// pod subnet back), and RemoveDefaultNetwork removes the rules.
func TestNodeWideMasquerade(t *testing.T) {
	cfg, m := testManager(t)
	ctx := context.Background()
	a := testPod(t, m, "masq")
	if _, err := m.Add(ctx, a); err != nil {
		t.Fatal(err)
	}
	if rules := natLines(t, a.ID); len(rules) > 0 {
		t.Errorf("the pod has rules of its own:\n%s", strings.Join(rules, "\n"))
	}

	// An address beyond the host: a netns behind a veth of its own.
	n := rand.Uint32()
	outNS, hostIf := fmt.Sprintf("nrt-out-%08x", n), fmt.Sprintf("nrto%08x", n)
	third := 1 + rand.IntN(250)
	hostIP, outIP := fmt.Sprintf("198.18.%d.1", third), fmt.Sprintf("198.18.%d.2", third)
	run(t, "ip", "netns", "add", outNS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", outNS).Run() })
	run(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", outNS)
	run(t, "ip", "addr", "add", hostIP+"/30", "dev", hostIf)
	run(t, "ip", "link", "set", hostIf, "up")
	run(t, "ip", "-n", outNS, "addr", "add", outIP+"/30", "dev", "eth0")
	run(t, "ip", "-n", outNS, "link", "set", "eth0", "up")
	l := inNamespace(t, filepath.Join("/run/netns", outNS), unix.CLONE_NEWNET, func() (net.Listener, error) {
		return net.Listen("tcp4", outIP+":0")
	})
	defer l.Close()
	peers := make(chan string, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			peers <- c.RemoteAddr().(*net.TCPAddr).IP.String()
			c.Close()
		}
	}()
	c := inNamespace(t, a.NetNS, unix.CLONE_NEWNET, func() (net.Conn, error) {
		return net.DialTimeout("tcp4", l.Addr().String(), 5*time.Second)
	})
	c.Close()
	select {
	case peer := <-peers:
		if peer != hostIP {
			t.Errorf("the connection came from %s, want the host's %s", peer, hostIP)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the connection was never accepted")
	}

	if err := m.Del(ctx, a); err != nil {
		t.Fatal(err)
	}
	chain := masqChain(m.NetworkName())
	if out, err := exec.Command("iptables", "-w", "-t", "nat", "-S", chain).Output(); err != nil || !strings.Contains(string(out), "MASQUERADE") {
		t.Fatalf("node-wide chain %s after the pod's DEL: %v: %s", chain, err, out)
	}
	if _, _, err := RemoveDefaultNetwork(cfg); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("iptables", "-w", "-t", "nat", "-S", chain).Run(); err == nil {
		t.Errorf("chain %s left after RemoveDefaultNetwork", chain)
	}
	if out, _ := exec.Command("iptables", "-w", "-t", "nat", "-S", "POSTROUTING").Output(); strings.Contains(string(out), chain) {
		t.Errorf("a jump to %s left after RemoveDefaultNetwork:\n%s", chain, out)
	}
}

// Starting again, or with another subnet for the network, keeps the rules
// once each: the jump from the old subnet goes.
func TestEnsureMasqueradeIsIdempotent(t *testing.T) {
	requireRoot(t)
	network := fmt.Sprintf("nrt-masq-%08x", rand.Uint32())
	ctx := context.Background()
	t.Cleanup(func() { RemoveMasquerade(ctx, network) })
	for _, subnet := range []string{"10.201.7.0/24", "10.201.7.0/24", "10.201.8.5/24"} {
		if err := ensureMasquerade(ctx, network, subnet); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, masqComment(network)) {
			ours = append(ours, line)
		}
	}
	want := []string{
		fmt.Sprintf(`-A POSTROUTING -s 10.201.8.0/24 -m comment --comment "%s" -j %s`, masqComment(network), masqChain(network)),
		fmt.Sprintf(`-A %s -d 10.201.8.0/24 -m comment --comment "%s" -j ACCEPT`, masqChain(network), masqComment(network)),
		fmt.Sprintf(`-A %s ! -d 224.0.0.0/4 -m comment --comment "%s" -j MASQUERADE`, masqChain(network), masqComment(network)),
	}
	if strings.Join(ours, "\n") != strings.Join(want, "\n") {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(ours, "\n"), strings.Join(want, "\n"))
	}
	if err := RemoveMasquerade(ctx, network); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("iptables-save", "-t", "nat").Output(); strings.Contains(string(out), masqChain(network)) {
		t.Errorf("rules left after removeMasquerade")
	}
}

package cni

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"strings"
)

// The pods of noderun's own default network are masqueraded by one rule
// set for the whole subnet, made once when the config loads, rather than by
// the bridge plugin's ipMasq, which gives every pod a chain of its own: four
// iptables calls at each ADD and more at each DEL, each reading the whole
// nat table (iptables-nft), so that a burst of pods spends most of its
// network time there and the calls of parallel ADDs contend. The traffic
// is the same: what leaves the subnet, multicast aside, goes out with the
// host's address; what stays in it keeps the pod's. A user's conflist keeps
// its plugins' own rules.

// masqChain names the node-wide chain of network (iptables allows 28
// characters).
func masqChain(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "NODERUN-MASQ-" + hex.EncodeToString(sum[:6])
}

func masqComment(network string) string { return "noderun masquerade, network " + network }

// masqIPTables is the iptables binary for the subnet's family, and the
// multicast range the bridge plugin leaves unmasqueraded in it.
func masqIPTables(subnet string) (bin, multicast string, err error) {
	ip, _, err := net.ParseCIDR(subnet)
	if err != nil {
		return "", "", err
	}
	if ip.To4() != nil {
		return "iptables", "224.0.0.0/4", nil
	}
	return "ip6tables", "ff00::/8", nil
}

// ensureMasquerade makes sure the node-wide rules of network masquerade
// subnet, adding what is missing: rules already in place are left alone,
// so the pods running meanwhile never lose them. Jumps left from an
// earlier subnet of the network are removed.
func ensureMasquerade(ctx context.Context, network, subnet string) error {
	bin, multicast, err := masqIPTables(subnet)
	if err != nil {
		return fmt.Errorf("cni: masquerade %s: %w", network, err)
	}
	_, ipnet, _ := net.ParseCIDR(subnet)
	subnet = ipnet.String() // as iptables -S prints it
	path, err := exec.LookPath(bin)
	if err != nil {
		return fmt.Errorf("cni: masquerade %s: %w", network, err)
	}
	chain, comment := masqChain(network), masqComment(network)
	if _, err := iptables(ctx, path, "-S", chain); err != nil {
		if _, err := iptables(ctx, path, "-N", chain); err != nil {
			return fmt.Errorf("cni: masquerade %s: %w", network, err)
		}
	}
	rules := [][]string{
		{chain, "-d", subnet, "-m", "comment", "--comment", comment, "-j", "ACCEPT"},
		{chain, "!", "-d", multicast, "-m", "comment", "--comment", comment, "-j", "MASQUERADE"},
	}
	present := true
	for _, r := range rules {
		if _, err := iptables(ctx, path, append([]string{"-C"}, r...)...); err != nil {
			present = false
		}
	}
	if !present { // in order: the ACCEPT first
		if _, err := iptables(ctx, path, "-F", chain); err != nil {
			return fmt.Errorf("cni: masquerade %s: %w", network, err)
		}
		for _, r := range rules {
			if _, err := iptables(ctx, path, append([]string{"-A"}, r...)...); err != nil {
				return fmt.Errorf("cni: masquerade %s: %w", network, err)
			}
		}
	}
	jump := []string{"POSTROUTING", "-s", subnet, "-m", "comment", "--comment", comment, "-j", chain}
	if err := removeJumps(ctx, path, chain, subnet); err != nil {
		return fmt.Errorf("cni: masquerade %s: %w", network, err)
	}
	if _, err := iptables(ctx, path, append([]string{"-C"}, jump...)...); err != nil {
		if _, err := iptables(ctx, path, append([]string{"-A"}, jump...)...); err != nil {
			return fmt.Errorf("cni: masquerade %s: %w", network, err)
		}
	}
	return nil
}

// removeJumps deletes POSTROUTING's jumps to chain, but for the one from
// keep ("" to delete them all).
func removeJumps(ctx context.Context, path, chain, keep string) error {
	out, err := iptables(ctx, path, "-S", "POSTROUTING")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(out), "\n") {
		args := splitRule(line)
		if len(args) < 2 || args[0] != "-A" || !strings.HasSuffix(line, " -j "+chain) {
			continue
		}
		if keep != "" && strings.Contains(line, " -s "+keep+" ") {
			continue
		}
		if _, err := iptables(ctx, path, append([]string{"-D"}, args[1:]...)...); err != nil {
			return err
		}
	}
	return nil
}

// RemoveMasquerade removes network's node-wide rules once none of its pods
// runs (reset; tests that made a network of their own): the jumps to its
// chain, then the chain. Either family may hold them.
func RemoveMasquerade(ctx context.Context, network string) error {
	chain := masqChain(network)
	for _, bin := range []string{"iptables", "ip6tables"} {
		path, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		if _, err := iptables(ctx, path, "-S", chain); err != nil {
			continue // no such chain
		}
		if err := removeJumps(ctx, path, chain, ""); err != nil {
			return fmt.Errorf("cni: remove masquerade %s: %w", network, err)
		}
		for _, op := range []string{"-F", "-X"} {
			if _, err := iptables(ctx, path, op, chain); err != nil {
				return fmt.Errorf("cni: remove masquerade %s: %w", network, err)
			}
		}
	}
	return nil
}

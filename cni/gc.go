package cni

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"
)

// GC releases the network state of every attachment noderun made whose ID
// is not in keep and that has no Add, Del or Check running, and returns
// those IDs, sorted:
//
//   - attachments in libcni's cache: a DEL with the cached config, in the
//     pod's netns if it is still pinned, which releases IPs, portmap and
//     masquerade rules and the cache entry;
//   - host-local leases of the networks noderun knows (the loaded config's
//     and the cached ones) left without a cache entry, e.g. by a crash
//     mid-ADD: the lease file is removed;
//   - the iptables nat rules and chains that portmap and the bridge
//     plugin's ipMasq made for those IDs, which a DEL without the pod's
//     interface leaves behind.
//
// Leases and rules are released only for IDs in noderun's cache or ledger,
// so other runtimes (or noderun instances) using the same network, even
// the same lease dir, keep theirs. keep must list every attachment the
// caller may still Add while GC runs. GC is idempotent; on errors it goes
// on and returns them joined.
func (m *Manager) GC(ctx context.Context, keep map[string]bool) (released []string, err error) {
	m.gcMu.Lock()
	defer m.gcMu.Unlock()
	gone := func(id string) bool { return id != "" && !keep[id] && !m.isBusy(id) }
	cached, err := m.cni.GetCachedAttachments("")
	if err != nil {
		return nil, fmt.Errorf("cni: gc: %w", err)
	}
	owned, err := m.owned.owners()
	if err != nil {
		return nil, fmt.Errorf("cni: gc: %w", err)
	}
	var lists []*libcni.NetworkConfigList
	if l := m.lastList(); l != nil {
		lists = append(lists, l)
	}
	var errs []error
	left := map[natOwner]bool{} // owned and gone: whose leftovers to look for
	for o := range owned {
		if gone(o.id) {
			left[o] = true
		}
	}
	for _, c := range cached {
		if l, err := libcni.NetworkConfFromBytes(c.Config); err == nil {
			lists = append(lists, l)
		}
		o := natOwner{c.Network, c.ContainerID}
		owned[o] = true // made before the ledger existed, or it was lost
		if !gone(c.ContainerID) {
			continue
		}
		// A DEL in the netns, if still there, also removes the veth
		// and with it the masquerade rules.
		netns, _ := liveNetNS(c.NetNS)
		delCtx, cancel := context.WithTimeout(ctx, m.bounds.op)
		_, err := m.delCached(delCtx, c, netns, nil)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		released = append(released, c.ContainerID)
		left[o] = true
	}
	for _, dir := range leaseDirs(lists) {
		lockCtx, cancel := context.WithTimeout(ctx, m.bounds.lock)
		ids, err := releaseLeases(lockCtx, dir.path, func(id string) bool { return owned[natOwner{dir.network, id}] && gone(id) })
		cancel()
		errs = append(errs, err)
		for _, id := range ids {
			released = append(released, id)
			left[natOwner{dir.network, id}] = true
		}
	}
	if len(left) > 0 { // spares the iptables calls when nothing was left
		natCtx, cancel := context.WithTimeout(ctx, m.bounds.op)
		ids, err := releaseNAT(natCtx, func(o natOwner) bool { return left[o] && gone(o.id) })
		cancel()
		errs = append(errs, err)
		released = append(released, ids...)
	}
	if errors.Join(errs...) == nil {
		// Only after a clean pass, so that what failed is tried again.
		for o := range left {
			errs = append(errs, m.forget(o.id))
		}
	}

	slices.Sort(released)
	released = slices.Compact(released)
	if len(released) > 0 {
		m.log.Info("released pod networks", "ids", released)
	}
	return released, errors.Join(errs...)
}

// leaseDir is where host-local keeps the leases of one network.
type leaseDir struct{ network, path string }

// hostLocalDataDir is host-local's default dataDir.
const hostLocalDataDir = "/var/lib/cni/networks"

// leaseDirs returns the host-local lease dirs of the networks, once each.
func leaseDirs(lists []*libcni.NetworkConfigList) []leaseDir {
	var dirs []leaseDir
	for _, l := range lists {
		for _, p := range l.Plugins {
			var conf struct {
				IPAM struct {
					Type    string `json:"type"`
					DataDir string `json:"dataDir"`
				} `json:"ipam"`
			}
			if json.Unmarshal(p.Bytes, &conf) != nil || conf.IPAM.Type != "host-local" {
				continue
			}
			if conf.IPAM.DataDir == "" {
				conf.IPAM.DataDir = hostLocalDataDir
			}
			d := leaseDir{l.Name, filepath.Join(conf.IPAM.DataDir, l.Name)}
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// releaseLeases removes the host-local leases in dir of the IDs gone reports
// true for and returns those IDs. A lease is a file named after the IP that
// holds "<id>\r\n<ifname>" (host-local 1.x; older ones wrote only the id).
// It holds host-local's lock meanwhile, so that no ADD or DEL of the network
// changes a lease between reading and removing it.
func releaseLeases(ctx context.Context, dir string, gone func(string) bool) (ids []string, retErr error) {
	unlock, err := lockDir(ctx, dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // nothing ever allocated there
	}
	if err != nil {
		return nil, fmt.Errorf("cni: gc leases in %s: %w", dir, err)
	}
	defer unlock()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cni: gc leases in %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if net.ParseIP(e.Name()) == nil {
			continue // the lock and last_reserved_ip.* files
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		id, _, _ := strings.Cut(string(data), "\n")
		if id = strings.TrimSpace(id); !gone(id) {
			continue
		}
		if err := os.Remove(path); err != nil {
			errs = append(errs, err)
			continue
		}
		ids = append(ids, id)
	}
	if err := errors.Join(errs...); err != nil {
		return ids, fmt.Errorf("cni: gc leases in %s: %w", dir, err)
	}
	return ids, nil
}

// lockDir takes host-local's lock of a lease dir (an flock on its "lock"
// file), polling so that ctx can end the wait.
func lockDir(ctx context.Context, dir string) (unlock func(), err error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// natOwner is the network and attachment ID a nat rule's comment names.
type natOwner struct{ network, id string }

// natComment matches the comments of the bridge plugin's masquerade rules
// ("name: \"net\" id: \"id\"") and portmap's DNAT rules ("dnat name: ...").
var natComment = regexp.MustCompile(`^(?:dnat )?name: "([^"]*)" id: "([^"]*)"$`)

// natEntryChains are where those plugins jump to their per-attachment chains
// (CNI-<hash> for masquerade, CNI-DN-<hash> for DNAT).
var natEntryChains = []string{"POSTROUTING", "CNI-HOSTPORT-DNAT"}

// releaseNAT deletes the rules in natEntryChains whose comment names an
// owner for which owned is true, then the per-attachment chains they jump
// to, for IPv4 and IPv6, and returns the owners' IDs. As for the plugins, a
// missing binary, or an IPv6 nat table that cannot be listed (IPv6 off),
// means no rules of that family.
func releaseNAT(ctx context.Context, owned func(natOwner) bool) ([]string, error) {
	var ids []string
	var errs []error
	for _, bin := range []string{"iptables", "ip6tables"} {
		path, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		out, err := iptables(ctx, path, "-S")
		if err != nil {
			if bin == "iptables" || ctx.Err() != nil {
				errs = append(errs, err)
			}
			continue
		}
		rules, chains := natRules(out, owned)
		for _, r := range rules {
			if _, err := iptables(ctx, path, append([]string{"-D"}, r.args...)...); err != nil {
				errs = append(errs, err)
				continue
			}
			ids = append(ids, r.owner.id)
		}
		for _, c := range chains {
			// -F first: -X refuses a chain that still has rules.
			if _, err := iptables(ctx, path, "-F", c); err != nil {
				errs = append(errs, err)
				continue
			}
			if _, err := iptables(ctx, path, "-X", c); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return ids, errors.Join(errs...)
}

// natRule is a rule of `iptables -S` as the arguments that follow -A.
type natRule struct {
	owner natOwner
	args  []string
}

// natRules picks from `iptables -t nat -S` output the owned jumps from the
// entry chains to per-attachment chains, and those chains.
func natRules(out []byte, owned func(natOwner) bool) (rules []natRule, chains []string) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		args := splitRule(sc.Text())
		if len(args) < 2 || args[0] != "-A" || !slices.Contains(natEntryChains, args[1]) {
			continue
		}
		target, comment := argAfter(args, "-j"), argAfter(args, "--comment")
		sub := natComment.FindStringSubmatch(comment)
		if sub == nil || !strings.HasPrefix(target, "CNI-") {
			continue
		}
		o := natOwner{network: sub[1], id: sub[2]}
		if !owned(o) {
			continue
		}
		rules = append(rules, natRule{o, args[1:]})
		if !slices.Contains(chains, target) {
			chains = append(chains, target)
		}
	}
	return rules, chains
}

// xtablesWait is how many seconds an iptables call waits for the xtables
// lock (legacy iptables; nft ignores it) before it gives up; a bare -w
// would wait for ever on a process that never lets go.
const xtablesWait = "10"

// iptables runs an iptables command on the nat table, waiting a while for
// the xtables lock as the plugins do.
func iptables(ctx context.Context, path string, args ...string) ([]byte, error) {
	args = append([]string{"-w", xtablesWait, "-t", "nat"}, args...)
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(path), strings.Join(args, " "), whyKilled(ctx, err), bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// splitRule splits a line of `iptables -S` into arguments: words separated
// by spaces, where iptables double-quotes a word with spaces (as comments)
// and escapes quotes and backslashes in it.
func splitRule(line string) []string {
	var args []string
	var cur strings.Builder
	inWord, quoted, escaped := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case quoted && r == '\\':
			escaped = true
		case r == '"':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				args = append(args, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		args = append(args, cur.String())
	}
	return args
}

// argAfter returns the argument after flag, or "".
func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

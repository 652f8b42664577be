package cni

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// natSample is `iptables -t nat -S` with portmap and ipMasq rules of two
// pods, "a" and "b" in network "net", and of "a" in network "other".
const natSample = `-P PREROUTING ACCEPT
-N CNI-11
-N CNI-22
-N CNI-DN-11
-N CNI-HOSTPORT-DNAT
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A POSTROUTING -s 10.1.0.2/32 -m comment --comment "name: \"net\" id: \"a\"" -j CNI-11
-A POSTROUTING -s 10.1.0.3/32 -m comment --comment "name: \"net\" id: \"b\"" -j CNI-22
-A POSTROUTING -s 10.2.0.2/32 -m comment --comment "name: \"other\" id: \"a\"" -j CNI-33
-A CNI-11 -d 10.1.0.0/24 -m comment --comment "name: \"net\" id: \"a\"" -j ACCEPT
-A CNI-DN-11 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.1.0.2:80
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"net\" id: \"a\"" -m multiport --dports 8080 -j CNI-DN-11
-A CNI-HOSTPORT-DNAT -p udp -m comment --comment "dnat name: \"net\" id: \"a\"" -m multiport --dports 8080 -j CNI-DN-11
`

func TestNATRules(t *testing.T) {
	rules, chains := natRules([]byte(natSample), func(o natOwner) bool { return o == natOwner{"net", "a"} })
	var got []string
	for _, r := range rules {
		got = append(got, fmt.Sprintf("%q", r.args))
	}
	want := []string{
		fmt.Sprintf("%q", []string{"POSTROUTING", "-s", "10.1.0.2/32", "-m", "comment", "--comment", `name: "net" id: "a"`, "-j", "CNI-11"}),
		fmt.Sprintf("%q", []string{"CNI-HOSTPORT-DNAT", "-p", "tcp", "-m", "comment", "--comment", `dnat name: "net" id: "a"`, "-m", "multiport", "--dports", "8080", "-j", "CNI-DN-11"}),
		fmt.Sprintf("%q", []string{"CNI-HOSTPORT-DNAT", "-p", "udp", "-m", "comment", "--comment", `dnat name: "net" id: "a"`, "-m", "multiport", "--dports", "8080", "-j", "CNI-DN-11"}),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if want := []string{"CNI-11", "CNI-DN-11"}; !reflect.DeepEqual(chains, want) {
		t.Errorf("chains = %v, want %v", chains, want)
	}
}

func TestSplitRule(t *testing.T) {
	got := splitRule(`-A X  -m comment --comment "a \"q\" \\ b" -j Y`)
	want := []string{"-A", "X", "-m", "comment", "--comment", `a "q" \ b`, "-j", "Y"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("splitRule = %q, want %q", got, want)
	}
}

// leaseIDs returns the IDs holding host-local leases in the network.
func leaseIDs(t *testing.T, cfg Config, network string) []string {
	t.Helper()
	dir := filepath.Dir(leaseFile(cfg, network, "x"))
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			id, _, _ := strings.Cut(string(data), "\r\n")
			ids = append(ids, id)
		}
	}
	return ids
}

// testGC leaves five pods behind as a crash or reboot would, and checks GC
// releases exactly those it should. TestGC runs it with masquerade rules
// of each pod's own (a user's config).
func TestGC(t *testing.T) { testGC(t, perPodMasquerade) }

// The default config: the pods' chains leave masquerading to the
// node-wide rules, and GC's DEL of an unrecorded ADD runs the whole chain.
func TestGCNodeWideMasquerade(t *testing.T) { testGC(t) }

func testGC(t *testing.T, setup ...func(*testing.T, Config)) {
	cfg, m := testManager(t, setup...)
	ctx := context.Background()
	add := func(name string) Attachment {
		a := testPod(t, m, name)
		a.PortMappings = []PortMapping{{HostPort: 40000 + rand.IntN(10000), ContainerPort: 80}}
		if _, err := m.Add(ctx, a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	kept := add("kept")
	// Unknown to the caller, its netns still pinned: GC runs DEL in it.
	stale := add("stale")
	// Netns gone as after a reboot that kept iptables (or a lost run dir):
	// the DEL cannot find the masquerade rules, GC removes them.
	lost := add("lost")
	if err := RemoveNamespaces(filepath.Dir(lost.NetNS), nil); err != nil {
		t.Fatal(err)
	}
	// A crash mid-ADD: plugins ran, libcni never cached the result.
	crashed := add("crashed")
	if err := os.Remove(filepath.Join(cfg.CacheDir, "results", m.NetworkName()+"-"+crashed.ID+"-eth0")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveNamespaces(filepath.Dir(crashed.NetNS), nil); err != nil {
		t.Fatal(err)
	}
	// Being set up while GC runs, not yet in keep.
	busy := add("busy")
	done := m.track(busy.ID)
	keptRules, busyRules := natLines(t, kept.ID), natLines(t, busy.ID)
	if len(keptRules) == 0 {
		t.Fatal("no nat rules for a pod with a hostPort")
	}
	// A lease and rules in the same network made by someone else (another
	// runtime sharing the config and its lease dir) must survive.
	foreign := fmt.Sprintf("nrt-foreign-%08x", rand.Uint32())
	foreignLease := leaseFile(cfg, m.NetworkName(), strings.TrimSuffix(cfg.DefaultSubnet, "0/24")+"250")
	writeFiles(t, filepath.Dir(foreignLease), map[string]string{filepath.Base(foreignLease): foreign + "\r\neth0"})
	foreignChain := fmt.Sprintf("CNI-DN-nrt%08x", rand.Uint32())
	run(t, "iptables", "-w", "-t", "nat", "-N", foreignChain)
	run(t, "iptables", "-w", "-t", "nat", "-A", "CNI-HOSTPORT-DNAT", "-m", "comment", "--comment",
		fmt.Sprintf("dnat name: %q id: %q", m.NetworkName(), foreign), "-j", foreignChain)
	t.Cleanup(func() {
		if _, err := releaseNAT(context.Background(), func(o natOwner) bool { return o.id == foreign }); err != nil {
			t.Error(err)
		}
	})

	released, err := m.GC(ctx, map[string]bool{kept.ID: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{stale.ID, lost.ID, crashed.ID}
	slices.Sort(want)
	if !reflect.DeepEqual(released, want) {
		t.Errorf("GC released %v, want %v", released, want)
	}
	leases := leaseIDs(t, cfg, m.NetworkName())
	for _, a := range []Attachment{stale, lost, crashed} {
		if slices.Contains(leases, a.ID) {
			t.Errorf("%s still holds a lease", a.ID)
		}
		if m.Attached(a) {
			t.Errorf("%s still cached", a.ID)
		}
		if rules := natLines(t, a.ID); len(rules) > 0 {
			t.Errorf("nat rules left for %s:\n%s", a.ID, strings.Join(rules, "\n"))
		}
	}
	for _, a := range []Attachment{kept, busy} {
		if !slices.Contains(leases, a.ID) || !m.Attached(a) {
			t.Errorf("%s lost its lease or cache entry", a.ID)
		}
	}
	if !reflect.DeepEqual(natLines(t, kept.ID), keptRules) || !reflect.DeepEqual(natLines(t, busy.ID), busyRules) {
		t.Errorf("nat rules of kept or busy pods changed")
	}
	if err := m.Check(ctx, kept); err != nil {
		t.Errorf("kept pod broken by GC: %v", err)
	}
	if len(natLines(t, foreign)) != 1 {
		t.Errorf("foreign rule removed")
	}
	if _, err := os.Stat(foreignLease); err != nil {
		t.Errorf("foreign lease removed: %v", err)
	}

	if released, err := m.GC(ctx, map[string]bool{kept.ID: true}); err != nil || len(released) > 0 {
		t.Errorf("second GC released %v, %v; want nothing", released, err)
	}
	done()
	if released, err := m.GC(ctx, map[string]bool{kept.ID: true}); err != nil || !reflect.DeepEqual(released, []string{busy.ID}) {
		t.Errorf("GC after the busy pod's call ended released %v, %v; want %s", released, err, busy.ID)
	}
	owners, err := m.owned.owners()
	if want := map[natOwner]bool{{m.NetworkName(), kept.ID}: true}; err != nil || !reflect.DeepEqual(owners, want) {
		t.Errorf("ledger after GC = %v, %v; want only %s", owners, err, kept.ID)
	}
}

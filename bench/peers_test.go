package main

import (
	"net/netip"
	"slices"
	"testing"
)

func TestNATCleanup(t *testing.T) {
	rules := `-P POSTROUTING ACCEPT
-A POSTROUTING -s 10.216.0.8/32 -m comment --comment "name: \"k\" id: \"c6fe\"" -j CNI-3f6ff3b7ff2381a720c639d1
-A POSTROUTING -s 10.217.0.9/32 -m comment --comment "name: \"p\" id: \"a2f5\"" -j CNI-a5e80967cc0ff64b5ef03720
-A POSTROUTING -s 10.216.0.0/16 -j MASQUERADE
`
	got := natCleanup(rules, netip.MustParsePrefix("10.216.0.0/16"))
	want := []string{`iptables -t nat -D POSTROUTING -s 10.216.0.8/32 -m comment --comment "name: \"k\" id: \"c6fe\"" -j CNI-3f6ff3b7ff2381a720c639d1 && iptables -t nat -F CNI-3f6ff3b7ff2381a720c639d1 && iptables -t nat -X CNI-3f6ff3b7ff2381a720c639d1`}
	if !slices.Equal(got, want) {
		t.Errorf("natCleanup:\n got %q\nwant %q", got, want)
	}
}

func TestPeerTargets(t *testing.T) {
	ratios := map[string]float64{sysKubelet: 0.2, sysFloor: 1.1}
	ratio := func(peer string) float64 { return ratios[peer] }
	for _, c := range []struct {
		row              string
		targets, results []string
	}{
		{"reboot recovery of 30 pods: agent started → all Ready, s", []string{"≤ 0.3× kubelet", "≤ 1× floor"}, []string{"pass", "FAIL"}},
		{"whole-node PSS at 30 pods, MiB", []string{"≤ 0.5× kubelet"}, []string{"pass"}},
		{"whole-node PSS at 30 pods: agent, MiB", nil, nil},
		{"whole-node PSS at 100 pods, MiB", nil, nil},
		{"one pod: manifest → Ready in its own API, s", []string{"≤ 0.35× kubelet", "≤ 0.5× podman"}, []string{"pass", "not measured"}},
	} {
		targets, results := targetsOf(c.row, ratio)
		if !slices.Equal(targets, c.targets) || !slices.Equal(results, c.results) {
			t.Errorf("%s: %q %q, want %q %q", c.row, targets, results, c.targets, c.results)
		}
	}
	if measureOrder("one pod: x, s") >= measureOrder("pod with 3 init + 2 app containers: x, s") ||
		measureOrder("burst of 10: x, s") >= measureOrder("burst of 100: x, s") ||
		measureOrder("removal of 30 pods, s") >= measureOrder("removal of 100 pods, s") ||
		measureOrder("whole-node PSS at 30 pods, MiB") >= measureOrder("whole-node PSS at 30 pods: agent, MiB") {
		t.Error("measureOrder: rows out of the scenarios' order")
	}
}

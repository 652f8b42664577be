package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/cgroups"
)

// The engine makes each pod's cgroup in its QoS parent before its
// containers, which go below it, and keeps the Burstable parent's shares
// at the sum of the wanted Burstable pods' cpu requests as pods come and
// go; on a host with swap accounting containers get NoSwap. The cgroup
// tree is faked by plain dirs (v1 cgroupfs layout).
func TestEngineMakesPodCgroups(t *testing.T) {
	fs := t.TempDir()
	memsw := filepath.Join(fs, "memory", "memory.memsw.limit_in_bytes")
	if err := os.MkdirAll(filepath.Dir(memsw), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(memsw, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	layout := cgroups.Layout{FS: fs}
	f := startEngineWith(t, func(c *Config) { c.Cgroups, c.PodCgroups = layout, true })
	withRes := func(uid string, r v1.ResourceRequirements) *v1.Pod {
		p := testPod(uid, uid, v1.RestartPolicyAlways)
		p.Spec.Containers[0].Resources = r
		return p
	}
	burst1 := withRes("b1", res("250m", "", "", ""))
	burst2 := withRes("b2", res("500m", "1", "", ""))
	best := withRes("be", res("", "", "", ""))
	guar := withRes("g", res("500m", "500m", "64Mi", "64Mi"))
	file := func(parts ...string) string {
		b, _ := os.ReadFile(filepath.Join(append([]string{fs}, parts...)...))
		return string(b)
	}
	shares := func(want string) func() bool {
		return func() bool { return file("cpu", "noderun", "burstable", "cpu.shares") == want }
	}
	f.send(burst1, best, guar)
	waitFor(t, "three pods started", func() bool { return f.rt.startedCount() == 3 })
	if got := file("cpu", "noderun", "burstable", "cpu.shares"); got != "256" {
		t.Errorf("burstable shares %s, want 256 (250m)", got)
	}
	if got := file("cpu", "noderun", "besteffort", "cpu.shares"); got != "2" {
		t.Errorf("besteffort shares %s, want 2", got)
	}
	g := "pod" + SandboxID("g")
	for path, want := range map[string]string{
		"cpu/noderun/" + g + "/cpu.shares":                             "512",
		"cpu/noderun/" + g + "/cpu.cfs_quota_us":                       "50000",
		"memory/noderun/" + g + "/memory.limit_in_bytes":               "67108864",
		"cpu/noderun/burstable/pod" + SandboxID("b1") + "/cpu.shares":  "256",
		"cpu/noderun/besteffort/pod" + SandboxID("be") + "/cpu.shares": "2",
	} {
		if got := file(strings.Split(path, "/")...); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	f.rt.mu.Lock()
	for _, c := range f.rt.started {
		if want := layout.PodParent(qosTier(c.Pod), SandboxID(string(c.Pod.UID))); c.CgroupParent != want || !c.Resources.NoSwap {
			t.Errorf("%s: cgroup parent %s, NoSwap %t; want %s, true", c.Pod.UID, c.CgroupParent, c.Resources.NoSwap, want)
		}
	}
	f.rt.mu.Unlock()
	f.send(burst1, burst2, best, guar)
	waitFor(t, "burstable shares for 250m + 500m", shares("768"))
	f.send(burst2, best, guar)
	waitFor(t, "burstable shares for 500m once b1 is gone", shares("512"))
	f.send(best, guar)
	waitFor(t, "burstable shares 2 with no burstable pod", shares("2"))
	// A pod that has ended counts no more, as it is no active pod to the
	// kubelet.
	done := withRes("d", res("100m", "", "", ""))
	done.Spec.RestartPolicy = v1.RestartPolicyNever
	f.send(best, guar, done)
	waitFor(t, "burstable shares for the 100m of a running pod", shares("102"))
	var id string
	waitFor(t, "its container started", func() bool {
		f.rt.mu.Lock()
		defer f.rt.mu.Unlock()
		for _, c := range f.rt.started {
			if c.Pod.UID == "d" {
				id = c.ID
			}
		}
		return id != ""
	})
	f.rt.exit(id, 0)
	waitFor(t, "burstable shares 2 once that pod has succeeded", shares("2"))
}

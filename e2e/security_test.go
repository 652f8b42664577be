package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/ociimage"
)

// probeScript prints what the process sees of its confinement, one
// "key value" per line, then "done".
const probeScript = `grep -E '^(CapBnd|CapEff|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status | tr -d ':';
echo "timerList $(stat -c %F /proc/timer_list)";
echo "firmware $(ls /sys/firmware | wc -l)";
for m in /sys /proc/sys; do echo "$m $(awk -v m=$m '$2==m{split($4,o,",");r=o[1]} END{print r?r:"none"}' /proc/mounts)"; done;
echo "cgroups $(awk '$3=="cgroup"||$3=="cgroup2"{split($4,o,",");r=o[1]} END{print r?r:"none"}' /proc/mounts)";
[ -e /dev/kmsg ] && echo "kmsg yes" || echo "kmsg no";
touch /probe 2>/dev/null && echo "rootfs rw" || echo "rootfs ro";
mkdir /dev/shm/probe 2>/dev/null && echo "mkdir ok" || echo "mkdir denied";
echo done`

// probePod runs probeScript once with the given container securityContext
// (flow YAML) and pod securityContext.
func probePod(name, sc, podSC string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  restartPolicy: Never
  securityContext: %s
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", %q]
    securityContext: %s
`, name, podSC, probeScript, sc)
}

// probeView waits for a probe pod's output and returns it as a map.
func (n *node) probeView(name string) map[string]string {
	n.t.Helper()
	p := n.waitPod(name, "started", func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting == nil
	})
	path := n.logPath(p, "main", 0)
	n.waitLogLine(path, "done")
	view := map[string]string{}
	for _, l := range n.readLog(path) {
		if k, v, ok := strings.Cut(strings.Join(strings.Fields(l.content), " "), " "); ok {
			view[k] = v
		}
	}
	return view
}

// ownCapBnd is this (root) test process's bounding set: what containerd,
// running as root beside it, grants for privileged or add: [ALL].
func ownCapBnd(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no CapBnd in /proc/self/status")
	return ""
}

// What a container sees under the kubelet + containerd's CRI plugin, for
// each securityContext: the 14 default capabilities are 00000000a80425fb;
// NoNewPrivs is set only by allowPrivilegeEscalation: false; seccomp mode 2
// is a filter; unless privileged, masked files such as /proc/timer_list are
// /dev/null, masked directories such as /sys/firmware empty, and /sys,
// /proc/sys and the container's cgroups (under /sys/fs/cgroup) read-only (this
// kernel has no /proc/kcore); only privileged
// containers see host devices such as /dev/kmsg.
func TestSecurityContextAsSeenInside(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	all := ownCapBnd(t)
	profile := `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}`
	if err := os.MkdirAll(filepath.Join(n.state, "seccomp", "profiles"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.state, "seccomp", "profiles", "no-mkdir.json"), []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"CapBnd": "00000000a80425fb", "CapEff": "00000000a80425fb", "CapPrm": "00000000a80425fb",
		"NoNewPrivs": "0", "Seccomp": "0", "timerList": "character special file", "firmware": "0",
		"/sys": "ro", "/proc/sys": "ro", "cgroups": "ro", "kmsg": "no", "rootfs": "rw", "mkdir": "ok",
	}
	caps := func(v string) map[string]string { return map[string]string{"CapBnd": v, "CapEff": v, "CapPrm": v} }
	tests := []struct {
		name, sc, podSC string
		want            map[string]string // differences from base
	}{
		{"defaults", "{}", "{}", nil},
		{"drop-all", "{capabilities: {drop: [ALL]}}", "{}", caps("0000000000000000")},
		{"drop-all-add-one", "{capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}}", "{}", caps("0000000000000400")},
		{"cap-prefix", "{capabilities: {drop: [ALL], add: [CAP_NET_ADMIN]}}", "{}", caps("0000000000001000")},
		{"add-all", "{capabilities: {add: [ALL]}}", "{}", caps(all)},
		{"no-escalation", "{allowPrivilegeEscalation: false}", "{}", map[string]string{"NoNewPrivs": "1"}},
		{"read-only-root", "{readOnlyRootFilesystem: true}", "{}", map[string]string{"rootfs": "ro"}},
		{"pod-runtime-default", "{}", "{seccompProfile: {type: RuntimeDefault}}", map[string]string{"Seccomp": "2"}},
		{"container-overrides-pod", "{seccompProfile: {type: Unconfined}}", "{seccompProfile: {type: RuntimeDefault}}", nil},
		{"localhost", "{seccompProfile: {type: Localhost, localhostProfile: profiles/no-mkdir.json}}", "{}",
			map[string]string{"Seccomp": "2", "mkdir": "denied"}},
		{"privileged", "{privileged: true, seccompProfile: {type: RuntimeDefault}}", "{}", map[string]string{
			"CapBnd": all, "CapEff": all, "CapPrm": all, "timerList": "regular empty file", "firmware": "",
			"/sys": "rw", "/proc/sys": "none", "cgroups": "rw", "kmsg": "yes"}},
	}
	for _, tc := range tests {
		n.writeManifest(tc.name+".yaml", probePod(tc.name, tc.sc, tc.podSC))
	}
	for _, tc := range tests {
		got := n.probeView(tc.name)
		for k, v := range base {
			want, ok := tc.want[k]
			if !ok {
				want = v
			}
			if want == "" { // anything but the masked value
				if got[k] == v || got[k] == "" {
					t.Errorf("%s: %s = %q, want something else than %q", tc.name, k, got[k], v)
				}
			} else if got[k] != want {
				t.Errorf("%s: %s = %q, want %q", tc.name, k, got[k], want)
			}
		}
	}
}

// Refusals reach the pod's status as CreateContainerConfigError naming the
// field: a missing Localhost seccomp profile. (AppArmor on a host without
// it is rejected at admission: TestAdmissionAppArmor.)
func TestSecurityContextRefusals(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	tests := []struct{ name, sc, podSC, wantMsg string }{
		{"missing-profile", "{seccompProfile: {type: Localhost, localhostProfile: gone.json}}", "{}",
			"spec.containers[0].securityContext.seccompProfile.localhostProfile: cannot load seccomp profile \"" +
				filepath.Join(n.state, "seccomp", "gone.json") + "\""},
	}
	for _, tc := range tests {
		n.writeManifest(tc.name+".yaml", probePod(tc.name, tc.sc, tc.podSC))
	}
	for _, tc := range tests {
		p := n.waitPod(tc.name, "CreateContainerConfigError", func(p *v1.Pod) bool {
			return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
				p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError"
		})
		if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, tc.wantMsg) {
			t.Errorf("%s: message %q, want it to contain %q", tc.name, msg, tc.wantMsg)
		}
	}
	n.writeManifest("unconfined.yaml", probePod("unconfined", "{appArmorProfile: {type: Unconfined}}", "{}"))
	if got := n.probeView("unconfined"); got["CapBnd"] != "00000000a80425fb" {
		t.Errorf("unconfined AppArmor pod: CapBnd %q", got["CapBnd"])
	}
}

var runMarkerImage builtImage

// runMarkerRef is busybox with a file in /run.
const runMarkerRef = "noderun.test/run-marker:1"

func runMarkerTar(t *testing.T) string {
	return runMarkerImage.get(t, func() (string, error) {
		return busyboxWith(runMarkerRef, "run-marker.tar", map[string]ociimage.File{
			"/run": ociimage.Dir(0o755), "/run/marker": ociimage.Regular([]byte("from-image\n"), 0o644)}, nil)
	})
}

// A container sees what it would under the kubelet and containerd's CRI
// plugin: its own cgroup's limits at /sys/fs/cgroup (what a JVM or Go's
// GOMAXPROCS reads to size itself), v1 or v2, and its image's /run, on
// which CRI mounts nothing (containerd's default spec has a tmpfs there).
func TestContainerSeesItsCgroupsAndImageRun(t *testing.T) {
	t.Parallel()
	n := newNodeWithImages(t, []string{runMarkerTar(t)})
	const script = `if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
echo "memory $(cat /sys/fs/cgroup/memory.max)"; echo "cpu $(cut -d' ' -f1 /sys/fs/cgroup/cpu.max)";
else
echo "memory $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"; echo "cpu $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)";
fi;
echo "marker $(cat /run/marker)";
echo done`
	n.writeManifest("limits.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: limits
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: %s
    command: ["sh", "-c", %q]
    resources: {limits: {memory: 64Mi, cpu: 500m}}
`, runMarkerRef, script))
	got := n.probeView("limits")
	want := map[string]string{"memory": "67108864", "cpu": "50000", "marker": "from-image"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

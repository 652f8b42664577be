package e2e

import (
	"testing"
)

// A pod with a full restrictive security context (what Pod Security's
// "restricted" profile asks for) sees what a kubelet with containerd gives:
// a non-root user with the fsGroup among its groups, no capabilities at
// all, no privilege escalation, containerd's default seccomp filter, a
// read-only root and a group-owned emptyDir.
func TestRestrictedSecurityContext(t *testing.T) {
	t.Parallel()
	n := newNode(t)
	n.writeManifest("restricted.yaml", `apiVersion: v1
kind: Pod
metadata: {name: restricted}
spec:
  terminationGracePeriodSeconds: 2
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    runAsGroup: 3000
    fsGroup: 2000
    seccompProfile: {type: RuntimeDefault}
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", 'grep -E "^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):" /proc/self/status; touch /x 2>&1; touch /data/f && stat -c "data %u:%g" /data/f; echo done; `+untilTerm+`']
    volumeMounts: [{name: data, mountPath: /data}]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
`)
	p := n.waitPod("restricted", "Running", running)
	log := n.logPath(p, "main", 0)
	n.waitLogLine(log, "done")
	for _, want := range []string{
		"Uid:\t1000\t1000\t1000\t1000",
		"Gid:\t3000\t3000\t3000\t3000",
		"Groups:\t2000 3000 ",
		"CapInh:\t0000000000000000",
		"CapPrm:\t0000000000000000",
		"CapEff:\t0000000000000000",
		"CapBnd:\t0000000000000000",
		"CapAmb:\t0000000000000000",
		"NoNewPrivs:\t1",
		"Seccomp:\t2",
		"touch: /x: Read-only file system",
		"data 1000:2000",
	} {
		found := false
		for _, l := range n.readLog(log) {
			found = found || l.content == want
		}
		if !found {
			t.Errorf("the container does not see %q", want)
		}
	}
	if t.Failed() {
		for _, l := range n.readLog(log) {
			t.Logf("inside: %s", l.content)
		}
	}
}

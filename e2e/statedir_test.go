package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// A --state-dir reached through a link (/var/lib/noderun -> /data/noderun):
// a container with a hostPath subPath restarts after a crash, and removing
// its manifest unmounts the pinned subPath and the Memory emptyDir rather
// than delete through the pin into the host directory. Before the fix the
// restart waited with "file exists" for ever and the removal deleted the
// host file.
func TestStateDirThroughLink(t *testing.T) {
	t.Parallel()
	n := prepareNode(t)
	real := filepath.Join(n.root, "disk", "noderun")
	for _, d := range []string{real, n.run, n.logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(real, n.state); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(n.root, "host-srv")
	precious := filepath.Join(host, "db", "precious.sqlite")
	if err := os.MkdirAll(filepath.Dir(precious), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(precious, []byte("customer data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.writeManifest("db.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: db}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: db
    image: busybox:1.36
    command: ["sh", "-c", 'cat /var/lib/db/precious.sqlite; echo run >> /var/lib/db/runs; [ "$(wc -l < /var/lib/db/runs)" -ge 2 ] || exit 1; %s']
    volumeMounts: [{name: srv, mountPath: /var/lib/db, subPath: db}, {name: scratch, mountPath: /scratch}]
  volumes:
  - {name: srv, hostPath: {path: %s}}
  - {name: scratch, emptyDir: {medium: Memory}}
`, untilTerm, host))
	p := n.waitPodFor("db", "running again after its crash", 2*time.Minute, func(p *v1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].RestartCount == 1
	})
	if m := mountsUnder(t, real); len(m) != 2 {
		t.Errorf("mounts under the state dir while the pod runs: %v, want the subPath's pin and the tmpfs", m)
	}
	n.waitLogLine(n.logPath(p, "db", 1), "customer data")

	n.removeManifest("db.yaml")
	n.waitGone("db", time.Minute)
	if b, err := os.ReadFile(precious); err != nil || string(b) != "customer data\n" {
		t.Errorf("the host file after the pod's removal: %q, %v", b, err)
	}
	if m := mountsUnder(t, real); len(m) != 0 {
		t.Errorf("mounts left under the state dir: %v", m)
	}
	if _, err := os.Stat(filepath.Join(real, "pods", string(p.UID))); !os.IsNotExist(err) {
		t.Errorf("the pod's state dir: %v, want removed", err)
	}
}

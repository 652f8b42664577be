package e2e

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// secretValue is what must reach the pod's secret volume and env, and
// nothing else: no log, no event, no file outside the volume's tmpfs.
const secretValue = "s3cr3t-e2e-7f3a9c"

func localConfigManifest(greeting, level string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: app-config}
data: {greeting: %q, level: %q}
---
apiVersion: v1
kind: Secret
metadata: {name: app-secret}
stringData: {password: %q}
---
apiVersion: v1
kind: Pod
metadata: {name: cfg}
spec:
  terminationGracePeriodSeconds: 2
  securityContext: {fsGroup: 3000}
  volumes:
  - name: config
    configMap:
      name: app-config
      defaultMode: 0640
      items: [{key: greeting, path: greeting.txt}, {key: level, path: sub/level, mode: 0604}]
  - name: secret
    secret: {secretName: app-secret, defaultMode: 0400}
  - name: all
    projected:
      sources:
      - configMap: {name: app-config, items: [{key: level, path: level}]}
      - secret: {name: app-secret}
      - downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}
  containers:
  - name: main
    image: busybox:1.36
    env:
    - {name: LEVEL, valueFrom: {configMapKeyRef: {name: app-config, key: level}}}
    - {name: PW, valueFrom: {secretKeyRef: {name: app-secret, key: password}}}
    envFrom: [{prefix: CFG_, configMapRef: {name: app-config}}]
    command: ["sh", "-c", 'echo "env LEVEL=$LEVEL CFG_greeting=$CFG_greeting pwlen=${#PW}"; trap "exit 0" TERM; last=; while true; do g=$(cat /etc/config/greeting.txt); if [ "$g" != "$last" ]; then echo "file greeting=$g"; last=$g; fi; sleep 1; done']
    volumeMounts:
    - {name: config, mountPath: /etc/config}
    - {name: secret, mountPath: /etc/secret}
    - {name: all, mountPath: /etc/all}
`, greeting, level, secretValue)
}

// With --local-config-objects, ConfigMap and Secret documents beside a pod
// fill its volumes (with their modes and the fsGroup's read; the secret's
// and the projected one on a tmpfs) and its env;
// an edit of the ConfigMap swaps the volume's ..data link to a new
// generation while env keeps its value until the container restarts; a
// missing reference is the kubelet's CreateContainerConfigError or
// FailedMount; the secret's value is nowhere else.
func TestLocalConfigObjects(t *testing.T) {
	t.Parallel()
	n := newNode(t, "--local-config-objects")
	n.writeManifest("cfg.yaml", localConfigManifest("hello", "debug"))
	p := n.waitPod("cfg", "Running", running)
	log0 := n.logPath(p, "main", 0)
	n.waitLogLine(log0, fmt.Sprintf("env LEVEL=debug CFG_greeting=hello pwlen=%d", len(secretValue)))
	n.waitLogLine(log0, "file greeting=hello")

	vols := filepath.Join(n.state, "pods", string(p.UID), "volumes")
	cfgDir, secDir, allDir := filepath.Join(vols, "configmap", "config"), filepath.Join(vols, "secret", "secret"), filepath.Join(vols, "projected", "all")
	// Modes as given, plus the fsGroup's read (the kubelet's roMask), the
	// files the fsGroup's.
	for path, want := range map[string]struct {
		content string
		mode    os.FileMode
	}{
		filepath.Join(cfgDir, "greeting.txt"): {"hello", 0o640},
		filepath.Join(cfgDir, "sub", "level"): {"debug", 0o644},
		filepath.Join(secDir, "password"):     {secretValue, 0o440},
		filepath.Join(allDir, "level"):        {"debug", 0o644},
		filepath.Join(allDir, "password"):     {secretValue, 0o644},
		filepath.Join(allDir, "name"):         {"cfg-" + nodeName, 0o644},
	} {
		var st syscall.Stat_t
		err := syscall.Stat(path, &st)
		b, rerr := os.ReadFile(path)
		if mode := os.FileMode(st.Mode).Perm(); err != nil || rerr != nil || string(b) != want.content || mode != want.mode || st.Gid != 3000 {
			t.Errorf("%s = %q mode %v gid %d (%v, %v), want %q mode %v gid 3000", path, b, mode, st.Gid, err, rerr, want.content, want.mode)
		}
	}

	// The secret volume is a tmpfs of its own, as the container sees it;
	// the configMap volume is not.
	mountinfo, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", n.mainPID(p, "main")))
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"/etc/secret", "/etc/all"} {
		if fstype := mountFSType(mountinfo, target); fstype != "tmpfs" {
			t.Errorf("%s is %q in the container's mountinfo, want tmpfs:\n%s", target, fstype, mountinfo)
		}
	}
	if fstype := mountFSType(mountinfo, "/etc/config"); fstype == "tmpfs" || fstype == "" {
		t.Errorf("/etc/config is %q in the container's mountinfo, want the state dir's filesystem", fstype)
	}

	// Edit the ConfigMap: the volume moves to a new generation in one
	// rename of ..data; env stays as it was, and the container runs on.
	gen0, err := os.Readlink(filepath.Join(cfgDir, "..data"))
	if err != nil {
		t.Fatal(err)
	}
	var before syscall.Stat_t
	if err := syscall.Stat(filepath.Join(cfgDir, "..data", "greeting.txt"), &before); err != nil {
		t.Fatal(err)
	}
	n.writeManifest("cfg.yaml", localConfigManifest("hello again", "info"))
	n.waitLogLine(log0, "file greeting=hello again")
	gen1, err := os.Readlink(filepath.Join(cfgDir, "..data"))
	if err != nil || gen1 == gen0 || !strings.HasPrefix(gen1, "..") {
		t.Errorf("..data -> %q after the edit (%v), was %q: want a new generation", gen1, err, gen0)
	}
	if target, _ := os.Readlink(filepath.Join(cfgDir, "greeting.txt")); target != "..data/greeting.txt" {
		t.Errorf("greeting.txt -> %q, want ..data/greeting.txt", target)
	}
	var after syscall.Stat_t
	if err := syscall.Stat(filepath.Join(cfgDir, "..data", "greeting.txt"), &after); err != nil || after.Ino == before.Ino {
		t.Errorf("greeting.txt's inode %d after the edit (%v), was %d: want a new file", after.Ino, err, before.Ino)
	}
	if _, err := os.Stat(filepath.Join(cfgDir, gen0)); !os.IsNotExist(err) {
		t.Errorf("old generation %s still there: %v", gen0, err)
	}
	p1 := n.pod("cfg")
	if cs := containerStatus(p1, "main"); p1.UID != p.UID || cs.RestartCount != 0 {
		t.Fatalf("editing the ConfigMap replaced or restarted the pod: %s", statusJSON(p1))
	}
	if lines := n.readLog(log0); strings.Contains(fmt.Sprint(lines), "LEVEL=info") {
		t.Errorf("env changed without a restart: %v", lines)
	}

	// A restart reads env anew.
	if err := syscall.Kill(n.mainPID(p1, "main"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n.waitLogLine(n.logPath(p1, "main", 1), fmt.Sprintf("env LEVEL=info CFG_greeting=hello again pwlen=%d", len(secretValue)))

	// A restarted noderun reads the documents from the manifests again and
	// adopts the pod as it runs: same generation, no restart.
	n.stop()
	n.start()
	n.waitHealthy()
	p2 := n.waitPod("cfg", "Running", running)
	if cs := containerStatus(p2, "main"); p2.UID != p.UID || cs.RestartCount != 1 {
		t.Errorf("after a noderun restart: %s", statusJSON(p2))
	}
	if gen, _ := os.Readlink(filepath.Join(cfgDir, "..data")); gen != gen1 {
		t.Errorf("..data -> %q after a noderun restart, was %q", gen, gen1)
	}
	if b, err := os.ReadFile(filepath.Join(secDir, "password")); err != nil || string(b) != secretValue {
		t.Errorf("secret volume after a noderun restart: %v", err)
	}

	missingReferences(t, n)
	secretNowhereElse(t, n, secDir, allDir)
	checkCommandValidates(t, n)

	// The pod's removal unmounts its tmpfs volumes and removes them.
	n.removeManifest("cfg.yaml")
	n.waitGone("cfg", waitTimeout)
	if left := mountsUnder(t, vols); len(left) > 0 {
		t.Errorf("mounts left after the pod's removal: %v", left)
	}
	if _, err := os.Stat(vols); !os.IsNotExist(err) {
		t.Errorf("%s left after the pod's removal: %v", vols, err)
	}
}

// mountFSType is the filesystem type of the mount at target in mountinfo.
func mountFSType(mountinfo []byte, target string) string {
	for _, line := range strings.Split(string(mountinfo), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if f := strings.Fields(pre); ok && len(f) > 4 && f[4] == target {
			return strings.Fields(post)[0]
		}
	}
	return ""
}

// missingReferences: env from a ConfigMap that is not there waits in
// CreateContainerConfigError with the kubelet's message; a secret volume
// whose Secret is not there is a FailedMount event with its text.
func missingReferences(t *testing.T, n *node) {
	n.writeManifest("missing.yaml", `apiVersion: v1
kind: Pod
metadata: {name: missing}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: [sleep, "3600"]
    env: [{name: X, valueFrom: {configMapKeyRef: {name: nope, key: k}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: missingvol}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: s, secret: {secretName: gone}}]
  containers: [{name: main, image: busybox:1.36, command: [sleep, "3600"], volumeMounts: [{name: s, mountPath: /s}]}]
`)
	p := n.waitPod("missing", "CreateContainerConfigError", func(p *v1.Pod) bool {
		r, _ := waitingReason(p, "main")
		return r == "CreateContainerConfigError"
	})
	if _, msg := waitingReason(p, "main"); msg != `configmap "nope" not found` {
		t.Errorf("waiting message %q, want the kubelet's %q", msg, `configmap "nope" not found`)
	}
	deadline := time.Now().Add(waitTimeout)
	want := `MountVolume.SetUp failed for volume "s" : secret "gone" not found`
	for !hasEvent(n.events("missingvol"), "FailedMount", want) {
		if time.Now().After(deadline) {
			t.Fatalf("no FailedMount event %q: %v", want, n.events("missingvol"))
		}
		time.Sleep(pollEvery)
	}
	// Once documents define them, both start: a change of the objects
	// wakes every pod.
	n.writeManifest("late.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: nope}\ndata: {k: v}\n---\n"+
		"apiVersion: v1\nkind: Secret\nmetadata: {name: gone}\ndata: {}\n")
	n.waitPod("missing", "Running once its ConfigMap is defined", running)
	n.waitPod("missingvol", "Running once its Secret is defined", running)
	n.removeManifest("missing.yaml")
	n.removeManifest("late.yaml")
}

// secretNowhereElse: the secret's value is in no log line, event, API
// answer or file under the state, run and log dirs but the volumes (each
// a tmpfs).
func secretNowhereElse(t *testing.T, n *node, volumes ...string) {
	var events v1.EventList
	if err := n.get("/events", &events); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmt.Sprint(events), secretValue) {
		t.Errorf("an event holds the secret")
	}
	if out, _ := os.ReadFile(n.out); bytes.Contains(out, []byte(secretValue)) {
		t.Errorf("noderun's log holds the secret")
	}
	var manifests any
	if err := n.get("/manifests", &manifests); err != nil || strings.Contains(fmt.Sprint(manifests), secretValue) {
		t.Errorf("GET /manifests holds the secret (%v)", err)
	}
	for _, admin := range []bool{false, true} {
		for _, kind := range []string{"secrets", "configmaps"} {
			out, errOut, err := n.kubectl(n.kubeconfig(admin), "get", kind)
			if err == nil || !strings.Contains(errOut, `doesn't have a resource type "`+kind+`"`) || strings.Contains(out, secretValue) {
				t.Errorf("kubectl get %s (admin %v) = %v, %q, %q: want no such resource type", kind, admin, err, out, errOut)
			}
		}
	}
	for _, root := range []string{n.state, n.run, n.logs} {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil // a namespace file, a socket: nothing to read
			}
			if d.IsDir() && slices.Contains(volumes, path) {
				return fs.SkipDir
			}
			if d.Type().IsRegular() {
				if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(secretValue)) {
					t.Errorf("%s holds the secret", path)
				}
			}
			return nil
		})
	}
}

// checkCommandValidates: `noderun check` accepts the documents with the
// flag, refuses the pod without it in the kubelet's words, and names a
// reference nothing defines at the pod's file and line.
func checkCommandValidates(t *testing.T, n *node) {
	if out, err := exec.Command(noderunBin, "check", "--local-config-objects", n.podsDir).CombinedOutput(); err != nil {
		t.Errorf("check --local-config-objects: %v\n%s", err, out)
	}
	out, err := exec.Command(noderunBin, "check", n.podsDir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "spec.volumes[1].secret: static pods may not reference secrets (via secret volumes), as in Kubernetes v1.37 (there is no API server to read them from); noderun runs such pods with --local-config-objects") {
		t.Errorf("check without the flag: %v\n%s", err, out)
	}
	bad := filepath.Join(n.root, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec:\n  containers: [{name: c, image: busybox:1.36, envFrom: [{secretRef: {name: nope}}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(noderunBin, "check", "--local-config-objects", bad).CombinedOutput()
	if want := bad + `:1: spec.containers[0].envFrom[0].secretRef: secret "nope" not found in the manifest sources`; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("check of a missing reference: %v\n%s\nwant %s", err, out, want)
	}
}

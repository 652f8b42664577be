package manifests

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestIdentify(t *testing.T) {
	const doc = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, image: nginx}]}\n"
	identify := func(in, node, source string) *v1.Pod {
		t.Helper()
		docs, errs := decodeDocuments([]byte(in))
		if len(errs) > 0 || len(docs) != 1 {
			t.Fatalf("decode: %v", errs)
		}
		Identify(docs[0].pod, node, source, docs[0].raw)
		return docs[0].pod
	}
	base := identify(doc, "node1", "file:/etc/pods")

	tests := []struct {
		name     string
		pod      *v1.Pod
		sameUID  bool
		wantUID  types.UID
		wantName string
	}{
		{"same bytes, node and source", identify(doc, "node1", "file:/etc/pods"), true, "", "web-node1"},
		{"same document in JSON flow style", identify(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web"},"spec":{"containers":[{"image":"nginx","name":"c"}]}}`, "node1", "file:/etc/pods"), true, "", "web-node1"},
		{"other source", identify(doc, "node1", "file:/srv/pods"), false, "", "web-node1"},
		{"other node", identify(doc, "node2", "file:/etc/pods"), false, "", "web-node2"},
		{"edited manifest", identify(strings.Replace(doc, "{name: web}", "{name: web, labels: {a: b}}", 1), "node1", "file:/etc/pods"), false, "", "web-node1"},
		{"metadata.uid honoured", identify("apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: 1234-abcd}\n", "node1", "file:/etc/pods"), false, "1234-abcd", "web-node1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.pod.UID == base.UID; got != tt.sameUID {
				t.Errorf("UID %s vs %s: same = %v, want %v", tt.pod.UID, base.UID, got, tt.sameUID)
			}
			if tt.wantUID != "" && tt.pod.UID != tt.wantUID {
				t.Errorf("UID = %s, want %s", tt.pod.UID, tt.wantUID)
			}
			if tt.pod.Name != tt.wantName {
				t.Errorf("name = %s, want %s", tt.pod.Name, tt.wantName)
			}
		})
	}
}

func TestIdentifyFields(t *testing.T) {
	pod := &v1.Pod{}
	pod.Name = "web"
	Identify(pod, "node1", "file:/etc/pods", []byte(`{}`))
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(string(pod.UID)) {
		t.Errorf("UID %q is not 32 hex digits", pod.UID)
	}
	seen, err := time.Parse(time.RFC3339, pod.Annotations[ConfigSeenAnnotation])
	if err != nil || time.Since(seen) > time.Minute {
		t.Errorf("config.seen = %q: %v", pod.Annotations[ConfigSeenAnnotation], err)
	}
	checks := []struct{ name, got, want string }{
		{"namespace", pod.Namespace, "default"},
		{"nodeName", pod.Spec.NodeName, "node1"},
		{"config.source", pod.Annotations[ConfigSourceAnnotation], "file"},
		{"config.hash", pod.Annotations[ConfigHashAnnotation], string(pod.UID)},
		{"phase", string(pod.Status.Phase), ""},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}

	kube := &v1.Pod{}
	kube.Name, kube.Namespace = "etcd", "kube-system"
	Identify(kube, "cp", "file:/etc/kubernetes/manifests", []byte(`{}`))
	if kube.Namespace != "kube-system" || kube.Name != "etcd-cp" {
		t.Errorf("got %s/%s, want kube-system/etcd-cp", kube.Namespace, kube.Name)
	}
}

func TestCheckUID(t *testing.T) {
	for uid, ok := range map[string]bool{
		"0b9a1c3e-6f1d-4c55-9a0e-2f6f1b1d2c3a": true,
		"8d2f0c2e4b6a8c0e1f3a5b7c9d1e3f5a":     true,
		"my-app.v2":                            true,
		"":                                     false,
		".":                                    false,
		"..":                                   false,
		"../../..":                             false,
		"team/app":                             false,
		"a..b":                                 false,
		"-x":                                   false,
		"x\x00y":                               false,
		strings.Repeat("a", 65):                false,
	} {
		if err := CheckUID(uid); (err == nil) != ok {
			t.Errorf("CheckUID(%q) = %v, want ok=%v", uid, err, ok)
		}
	}
}

func TestFinalNameLimits(t *testing.T) {
	docs := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`, strings.Repeat("a", 250))
	res := parseManifest([]byte(docs), "long.json", "node-1", "file:/etc/pods", time.Now(), parseOptions{})
	if len(res.pods) != 0 || len(res.errs) == 0 {
		t.Fatalf("a 250-character name on node-1 gave pods %d errors %v, want refused", len(res.pods), res.errs)
	}
	if !strings.Contains(res.errs[0].Error(), "metadata.name") || !strings.Contains(res.errs[0].Error(), "253") {
		t.Errorf("error = %v, want it to name metadata.name and the 253 limit", res.errs[0])
	}
	docs = fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"namespace":%q},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`, strings.Repeat("b", 200), strings.Repeat("n", 40))
	res = parseManifest([]byte(docs), "long.json", "node-1", "file:/etc/pods", time.Now(), parseOptions{})
	if len(res.pods) != 0 || len(res.errs) == 0 || !strings.Contains(res.errs[0].Error(), "255") {
		t.Errorf("a log directory name over 255 characters: pods %d errors %v, want refused naming 255", len(res.pods), res.errs)
	}
}

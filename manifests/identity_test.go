package manifests

import (
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

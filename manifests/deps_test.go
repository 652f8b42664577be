package manifests

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestParseWaitFor(t *testing.T) {
	got, err := ParseWaitFor(" etcd-n1, cache-n1=Started,\n kube-system/migrate-n1 = Completed ", "default")
	want := []Dependency{
		{"default", "etcd-n1", WaitReady},
		{"default", "cache-n1", WaitStarted},
		{"kube-system", "migrate-n1", WaitCompleted},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ParseWaitFor = %+v, %v; want %+v", got, err, want)
	}
	for value, msg := range map[string]string{
		"a,,b":          "empty entry",
		"a=Running":     `condition "Running" is none of Ready, Started, Completed`,
		"Bad_Name":      `pod name "Bad_Name"`,
		"NS/a":          `namespace "NS"`,
		"a, default/a":  "default/a is named twice",
		"":              "empty entry",
		"a=ready":       `condition "ready"`,
		"x/y/z=Started": `pod name "y/z"`,
	} {
		if _, err := ParseWaitFor(value, "default"); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseWaitFor(%q) = %v, want an error with %q", value, err, msg)
		}
	}
}

func depPod(name, waitFor string, policy v1.RestartPolicy) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec: v1.PodSpec{RestartPolicy: policy}}
	if waitFor != "" {
		p.Annotations = map[string]string{WaitForAnnotation: waitFor}
	}
	return p
}

func TestDependencyErrors(t *testing.T) {
	pods := []*v1.Pod{
		depPod("a", "b", v1.RestartPolicyAlways),
		depPod("b", "c", v1.RestartPolicyAlways),
		depPod("c", "a, ok", v1.RestartPolicyAlways), // a -> b -> c -> a
		depPod("d", "a", v1.RestartPolicyAlways),     // waits for the cycle, is not on it
		depPod("ok", "", v1.RestartPolicyAlways),
		depPod("self", "self", v1.RestartPolicyAlways),
		depPod("done", "ok=Completed", v1.RestartPolicyAlways),
		depPod("job", "", v1.RestartPolicyNever),
		depPod("after", "job=Completed, ok=Started, elsewhere", v1.RestartPolicyAlways),
	}
	cycle := "wait-for cycle among default/a, default/b, default/c: none of them could ever start"
	want := map[types.UID]string{
		"a": cycle, "b": cycle, "c": cycle,
		"self": "the pod waits for itself",
		"done": "waits for default/ok to complete, but its restartPolicy is Always: it never completes",
	}
	check := func(complete bool) {
		got := map[types.UID]string{}
		for uid, me := range DependencyErrors(pods, complete) {
			if me.Field != "metadata.annotations[noderun.dev/wait-for]" {
				t.Errorf("%s: field %q", uid, me.Field)
			}
			got[uid] = me.Message
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("DependencyErrors(complete=%t) =\n%v\nwant\n%v", complete, got, want)
		}
	}
	check(false)
	want["after"] = "waits for default/elsewhere, which no manifest defines"
	check(true)
}

// A cycle across files of a source is refused with each pod's file:line,
// and the other pods run.
func TestCheckPathWaitForCycle(t *testing.T) {
	dir := t.TempDir()
	pod := func(name, waitFor string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\n  annotations:\n    noderun.dev/wait-for: " + waitFor +
			"\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), pod("a", "b-n1")+"---\n"+pod("free", "a-n1=Started"))
	writeFile(t, filepath.Join(dir, "b.yaml"), pod("b", "a-n1"))
	writeFile(t, filepath.Join(dir, "bad.yaml"), pod("bad", "bad-n1=Sometime"))
	snap := CheckPath(dir, "n1")
	cycle := "metadata.annotations[noderun.dev/wait-for]: wait-for cycle among default/a-n1, default/b-n1: none of them could ever start"
	want := []string{
		dir + `/bad.yaml:1: metadata.annotations[noderun.dev/wait-for]: "bad-n1=Sometime": condition "Sometime" is none of Ready, Started, Completed`,
		dir + "/a.yaml:1: " + cycle,
		dir + "/b.yaml:1: " + cycle,
	}
	if !reflect.DeepEqual(snap.Info.Errors, want) || len(snap.Pods) != 1 || snap.Pods[0].Name != "free-n1" {
		t.Errorf("errors:\n%s\nwant:\n%s\npods %d", strings.Join(snap.Info.Errors, "\n"), strings.Join(want, "\n"), len(snap.Pods))
	}
}

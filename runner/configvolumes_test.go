package runner

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/noderun/noderun/manifests"
)

func configTestWorker(t *testing.T, cms []*v1.ConfigMap, secrets []*v1.Secret) *podWorker {
	objs := &configObjects{}
	objs.set(map[string]manifests.Snapshot{"file:/a": {ConfigMaps: cms, Secrets: secrets}})
	return &podWorker{uid: "u1", env: &podEnv{cfg: &Config{StateDir: t.TempDir()}, objects: objs,
		events: &eventLog{}, clock: clocktesting.NewFakeClock(time.Unix(1e9, 0)), log: slog.New(slog.DiscardHandler)}}
}

func i32(v int32) *int32 { return &v }

// The kubelet's payloads: items pick keys and modes, defaultMode the rest,
// fsGroup adds the group's read; projected joins its sources.
func TestConfigPayload(t *testing.T) {
	yes, fsGroup := true, int64(2000)
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "ns"},
		Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"bin": {0, 1}}}
	sec := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "ns"}, Data: map[string][]byte{"pw": []byte("x")}}
	w := configTestWorker(t, []*v1.ConfigMap{cm}, []*v1.Secret{sec})
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: v1.PodSpec{SecurityContext: &v1.PodSecurityContext{FSGroup: &fsGroup}}}
	ref := func(n string) v1.LocalObjectReference { return v1.LocalObjectReference{Name: n} }
	tests := []struct {
		name    string
		vol     v1.VolumeSource
		want    map[string]uint32 // path -> mode
		wantErr string
	}{
		{"all keys", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: ref("cfg"), DefaultMode: i32(0o600)}},
			map[string]uint32{"a": 0o640, "b": 0o640, "bin": 0o640}, ""},
		{"items", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: ref("cfg"), DefaultMode: i32(0o400),
			Items: []v1.KeyToPath{{Key: "a", Path: "x/a.txt", Mode: i32(0o604)}}}}, map[string]uint32{"x/a.txt": 0o644}, ""},
		{"missing key", v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec", Items: []v1.KeyToPath{{Key: "k", Path: "k"}}}},
			nil, "references non-existent secret key: k"},
		{"missing key, optional", v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec", Optional: &yes, Items: []v1.KeyToPath{{Key: "k", Path: "k"}}}},
			map[string]uint32{}, ""},
		{"missing configMap", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: ref("nope")}}, nil, `configmap "nope" not found`},
		{"missing, optional", v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: ref("nope"), Optional: &yes}}, map[string]uint32{}, ""},
		{"projected", v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{DefaultMode: i32(0o400), Sources: []v1.VolumeProjection{
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: ref("cfg"), Items: []v1.KeyToPath{{Key: "b", Path: "b"}}}},
			{Secret: &v1.SecretProjection{LocalObjectReference: ref("sec")}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}},
		}}}, map[string]uint32{"b": 0o440, "pw": 0o440, "name": 0o440}, ""},
		{"projected, two missing", v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: ref("x")}}, {Secret: &v1.SecretProjection{LocalObjectReference: ref("y")}},
		}}}, nil, `[configmap "x" not found, secret "y" not found]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := w.configPayload(pod, v1.Volume{Name: "v", VolumeSource: tt.vol})
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			modes := map[string]uint32{}
			for k, f := range got {
				modes[k] = f.Mode
			}
			if len(modes) != len(tt.want) {
				t.Fatalf("files %v, want %v", modes, tt.want)
			}
			for k, m := range tt.want {
				if modes[k] != m {
					t.Errorf("%s mode %o, want %o", k, modes[k], m)
				}
			}
		})
	}
}

// A running pod's volume follows its ConfigMap through a new ..data
// generation; a ConfigMap that disappears leaves the files and says
// FailedMount in the kubelet's words.
func TestRefreshConfigVolumes(t *testing.T) {
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "default"}, Data: map[string]string{"k": "one"}}
	w := configTestWorker(t, []*v1.ConfigMap{cm}, nil)
	w.st = newPodState(nil)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u1"}, Spec: v1.PodSpec{Volumes: []v1.Volume{
		{Name: "c", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cfg"}}}}}}}
	w.refreshConfigVolumes(pod)
	dir := filepath.Join(w.podStateDir(), "volumes", "configmap", "c")
	read := func() string { b, _ := os.ReadFile(filepath.Join(dir, "k")); return string(b) }
	gen0, _ := os.Readlink(filepath.Join(dir, "..data"))
	if read() != "one" || gen0 == "" {
		t.Fatalf("k = %q, ..data -> %q", read(), gen0)
	}
	next := cm.DeepCopy()
	next.Data["k"] = "two"
	w.env.objects.set(map[string]manifests.Snapshot{"file:/a": {ConfigMaps: []*v1.ConfigMap{next}}})
	w.refreshConfigVolumes(pod)
	if gen1, _ := os.Readlink(filepath.Join(dir, "..data")); read() != "two" || gen1 == gen0 {
		t.Fatalf("after the change k = %q, ..data -> %q (was %q)", read(), gen1, gen0)
	}
	w.env.objects.set(map[string]manifests.Snapshot{})
	w.refreshConfigVolumes(pod)
	if read() != "two" {
		t.Errorf("a missing ConfigMap changed the files: %q", read())
	}
	evs := w.env.events.list()
	if len(evs) != 1 || evs[0].Reason != "FailedMount" || evs[0].Message != `MountVolume.SetUp failed for volume "c" : configmap "cfg" not found` {
		t.Errorf("events %+v", evs)
	}
}

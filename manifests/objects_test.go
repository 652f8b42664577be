package manifests

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var withObjects = parseOptions{localConfig: true}

const cfgAndPod = `apiVersion: v1
kind: ConfigMap
metadata: {name: app}
data: {greeting: hello}
binaryData: {logo: aGk=}
---
apiVersion: v1
kind: Secret
metadata: {name: pw, namespace: team}
stringData: {password: hunter2}
data: {password: b2xk, user: YWRt}
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  volumes: [{name: c, configMap: {name: app}}, {name: s, secret: {secretName: pw}}]
  containers:
  - name: app
    image: nginx:1.29
    envFrom: [{configMapRef: {name: app}}]
    env: [{name: PW, valueFrom: {secretKeyRef: {name: pw, key: password}}}]
`

func TestConfigObjectsDecoded(t *testing.T) {
	res := parseManifest([]byte(cfgAndPod), "a.yaml", "n1", "file:/x", time.Now(), withObjects)
	if len(res.errs) > 0 || len(res.pods) != 1 || len(res.objects) != 2 {
		t.Fatalf("errs %v, %d pods, %d objects", res.errs, len(res.pods), len(res.objects))
	}
	cm, s := res.objects[0].cm, res.objects[1].secret
	if cm.Namespace != "default" || cm.Data["greeting"] != "hello" || string(cm.BinaryData["logo"]) != "hi" || res.objects[0].line != 1 {
		t.Errorf("configMap %+v at line %d", cm, res.objects[0].line)
	}
	// stringData wins over data, as the API server merges it.
	if s.Type != "Opaque" || string(s.Data["password"]) != "hunter2" || string(s.Data["user"]) != "adm" || s.StringData != nil {
		t.Errorf("secret type %q data %q stringData %v", s.Type, s.Data, s.StringData)
	}
	if v := res.pods[0].pod.Spec.Volumes[0].ConfigMap.DefaultMode; v == nil || *v != 0o644 {
		t.Errorf("configMap defaultMode = %v, want 0644", v)
	}
	snap, fp := assemble("file:/x", []string{"a.yaml"}, map[string]*fileResult{"a.yaml": res})
	if len(snap.ConfigMaps) != 1 || len(snap.Secrets) != 1 || len(snap.Info.Objects) != 2 || snap.Info.Objects[1].Line != 7 {
		t.Errorf("snapshot objects %d, %d, info %+v", len(snap.ConfigMaps), len(snap.Secrets), snap.Info.Objects)
	}
	if strings.Contains(fp, "hunter2") || strings.Contains(fmt.Sprint(snap.Info), "hunter2") {
		t.Errorf("a secret value is in the fingerprint or the info")
	}
	// A changed value changes the fingerprint, so the change is sent.
	res2 := parseManifest([]byte(strings.Replace(cfgAndPod, "hunter2", "hunter3", 1)), "a.yaml", "n1", "file:/x", time.Now(), withObjects)
	if _, fp2 := assemble("file:/x", []string{"a.yaml"}, map[string]*fileResult{"a.yaml": res2}); fp2 == fp {
		t.Errorf("the fingerprint misses a secret's change")
	}
}

func TestConfigObjectsRefusedWithoutTheFlag(t *testing.T) {
	res := parseManifest([]byte(cfgAndPod), "a.yaml", "n1", "file:/x", time.Now(), parseOptions{})
	var got []string
	for _, e := range res.errs {
		got = append(got, e.Error())
	}
	for _, want := range []string{
		`a.yaml:1: kind: unsupported kind "ConfigMap" (want Pod or PodList; ConfigMap and Secret documents need --local-config-objects)`,
		`a.yaml:7: kind: unsupported kind "Secret"`,
		"a.yaml:17:23: spec.volumes[0].configMap: static pods may not reference configmaps (via configmap volumes), as in Kubernetes v1.37 (there is no API server to read them from); noderun runs such pods with --local-config-objects",
		"spec.volumes[1].secret: static pods may not reference secrets",
		"spec.containers[0].envFrom: static pods may not reference configmaps",
		"spec.containers[0].env[0].valueFrom.secretKeyRef: static pods may not reference secrets",
	} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("no error %q in\n%s", want, strings.Join(got, "\n"))
		}
	}
}

// Documents are checked as the API server checks them; a Secret's values
// never appear in an error.
func TestConfigObjectsValidated(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"bad key", "kind: ConfigMap\nmetadata: {name: a}\ndata: {'a b': x}\n", "data[a b]: a valid config key must consist of alphanumeric characters"},
		{"dup key", "kind: ConfigMap\nmetadata: {name: a}\ndata: {k: x}\nbinaryData: {k: eA==}\n", "binaryData[k]: duplicate of key present in data"},
		{"bad name", "kind: Secret\nmetadata: {name: A_b}\n", "metadata.name: a lowercase RFC 1123 subdomain"},
		{"no name", "kind: ConfigMap\nmetadata: {}\n", "metadata.name: name is required"},
		{"unknown field", "kind: ConfigMap\nmetadata: {name: a}\ndta: {}\n", "dta: unknown field"},
		{"tls needs keys", "kind: Secret\ntype: kubernetes.io/tls\nmetadata: {name: a}\nstringData: {tls.crt: x}\n", "data[tls.key]: Required value"},
		{"token", "kind: Secret\ntype: kubernetes.io/service-account-token\nmetadata: {name: a}\n", "type: service account tokens need an API server"},
		{"too big", "kind: ConfigMap\nmetadata: {name: a}\ndata: {k: " + strings.Repeat("x", 1<<20+1) + "}\n", "data: Too long: must have at most 1048576 bytes"},
		{"number in a secret", "kind: Secret\nmetadata: {name: a}\nstringData: {pin: 987654}\n", "stringData.pin: must be a string (the value is not shown)"},
		{"bad base64", "kind: Secret\nmetadata: {name: a}\ndata: {k: '987654!'}\n", "invalid Secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := parseManifest([]byte("apiVersion: v1\n"+tt.in), "a.yaml", "n1", "file:/x", time.Now(), withObjects)
			var got []string
			for _, e := range res.errs {
				got = append(got, e.Error())
			}
			all := strings.Join(got, "\n")
			if !strings.Contains(all, tt.want) || len(res.objects) != 0 {
				t.Errorf("errors\n%s\nwant %q and no object (%d)", all, tt.want, len(res.objects))
			}
			if strings.Contains(all, "987654") {
				t.Errorf("a secret value is in an error: %s", all)
			}
		})
	}
}

// A file that turns invalid keeps its objects' last good content; an
// immutable object may not change.
func TestConfigObjectsLastGoodAndImmutable(t *testing.T) {
	const v1 = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\nimmutable: true\ndata: {k: one}\n"
	prev := parseManifest([]byte(v1), "a.yaml", "n1", "file:/x", time.Now(), withObjects)
	next := keepLastGood(prev, parseManifest([]byte(strings.Replace(v1, "one", "two", 1)), "a.yaml", "n1", "file:/x", time.Now(), withObjects))
	if len(next.errs) != 1 || !strings.Contains(next.errs[0].Error(), "a.yaml:1: data: ConfigMap default/a: field is immutable when `immutable` is set") {
		t.Fatalf("errs %v", next.errs)
	}
	if len(next.objects) != 1 || next.objects[0].cm.Data["k"] != "one" || !next.objects[0].stale {
		t.Errorf("objects %+v, want the old one kept", next.objects)
	}
	broken := keepLastGood(prev, parseManifest([]byte(v1+"---\nkind: Pod\n"), "a.yaml", "n1", "file:/x", time.Now(), withObjects))
	if len(broken.objects) != 1 || broken.objects[0].stale {
		t.Errorf("a valid object next to an error: %+v", broken.objects)
	}
}

func TestWithoutSecrets(t *testing.T) {
	body, cut := withoutSecrets([]byte(cfgAndPod))
	if !cut || strings.Contains(string(body), "hunter2") || !strings.Contains(string(body), "kind: ConfigMap") || !strings.Contains(string(body), "kind: Pod") {
		t.Errorf("cut %v:\n%s", cut, body)
	}
	if _, cut := withoutSecrets([]byte(podWith(oneContainer))); cut {
		t.Errorf("cut a body without secrets")
	}
}

func TestReferenceErrors(t *testing.T) {
	res := parseManifest([]byte(cfgAndPod), "a.yaml", "n1", "file:/x", time.Now(), withObjects)
	snap, _ := assemble("file:/x", []string{"a.yaml"}, map[string]*fileResult{"a.yaml": res})
	// The secret is in namespace team, the pod in default.
	errs := ReferenceErrors([]Snapshot{snap})[snap.Pods[0].UID]
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	want := []string{
		`spec.volumes[1].secret: secret "pw" not found in the manifest sources: the pod would wait in ContainerCreating (FailedMount)`,
		`spec.containers[0].env[0].valueFrom.secretKeyRef: secret "pw" not found in the manifest sources: the container would not start (CreateContainerConfigError)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// With the flag, references are checked as the API server checks them.
func TestConfigReferencesValidated(t *testing.T) {
	tests := []struct{ spec, want string }{
		{"  volumes: [{name: c, configMap: {name: a, defaultMode: 01000}}]\n" + oneContainer, "spec.volumes[0].configMap.defaultMode: must be a number between 0 and 0777"},
		{"  volumes: [{name: c, secret: {items: [{key: k, path: ../x}]}}]\n" + oneContainer, "spec.volumes[0].secret.secretName: Required value"},
		{"  volumes: [{name: c, secret: {secretName: s, items: [{key: k, path: ../x}]}}]\n" + oneContainer, "spec.volumes[0].secret.items[0].path: must be a relative path"},
		{"  volumes: [{name: p, projected: {sources: [{configMap: {name: a, items: [{key: k, path: x}]}}, {secret: {name: s, items: [{key: k, path: x}]}}]}}]\n" + oneContainer, "spec.volumes[0].projected.sources[1]: conflicting duplicate paths: x"},
		{"  volumes: [{name: p, projected: {sources: [{}]}}]\n" + oneContainer, "spec.volumes[0].projected.sources[0]: exactly one of configMap, secret and downwardAPI is required"},
		{oneContainer + "    envFrom: [{configMapRef: {name: a}, secretRef: {name: b}}]\n", "spec.containers[0].envFrom[0]: exactly one of configMapRef and secretRef is required"},
		{oneContainer + "    env: [{name: X, valueFrom: {configMapKeyRef: {name: a, key: 'a b'}}}]\n", "spec.containers[0].env[0].valueFrom.configMapKeyRef.key: a valid config key"},
	}
	for _, tt := range tests {
		res := parseManifest([]byte(podWith(tt.spec)), "a.yaml", "n1", "file:/x", time.Now(), withObjects)
		var got []string
		for _, e := range res.errs {
			got = append(got, e.Error())
		}
		if all := strings.Join(got, "\n"); !strings.Contains(all, tt.want) {
			t.Errorf("errors\n%s\nwant %q", all, tt.want)
		}
	}
}

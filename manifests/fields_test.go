package manifests

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

//go:generate go test -count=1 -run ^(TestFieldsReference|TestReadmeFieldSummary)$ . -update-docs

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/reference/fields.md and README.md's field summary")

// typePaths lists every field path reachable from Pod by walking the
// core/v1 types and its metadata, descending below Works fields only (a refused or ignored
// field covers its subtree), as checkFields does on values.
func typePaths(t *testing.T) []string {
	t.Helper()
	var out []string
	var walk func(t reflect.Type, key string)
	walk = func(typ reflect.Type, key string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			name := jsonName(f)
			if name == "" {
				walk(f.Type, key)
				continue
			}
			fkey := join(key, name)
			if fkey == "spec.containers" || fkey == "spec.initContainers" {
				out = append(out, fkey)
				walk(reflect.TypeOf(v1.Container{}), "container")
				continue
			}
			out = append(out, fkey)
			if r := ruleIndex[fkey]; r == nil || (r.status != Works && r.status != OptIn) {
				continue
			}
			ft, k := f.Type, fkey
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				if ft.Kind() == reflect.Slice {
					k += "[]"
				}
				ft = ft.Elem()
			}
			if walkable(ft) {
				walk(ft, k)
			}
		}
	}
	walk(reflect.TypeOf(v1.Pod{}), "")
	return out
}

// Every field of the Pod API is in exactly one list; a Kubernetes upgrade
// that adds one fails here until someone decides what it means on noderun.
func TestEveryPodFieldIsClassified(t *testing.T) {
	paths := typePaths(t)
	seen := map[string]bool{}
	for _, p := range paths {
		if seen[p] {
			continue
		}
		seen[p] = true
		if ruleIndex[p] == nil && p != "container" {
			t.Errorf("field %s is in no list (works, refused, ignored): classify it in manifests/fields.go", p)
		}
	}
	dup := map[string]bool{}
	for _, r := range fieldRules {
		if dup[r.path] {
			t.Errorf("field %s is listed twice", r.path)
		}
		dup[r.path] = true
		if !seen[r.path] {
			t.Errorf("listed field %s is not a field of the Pod API (or sits below a refused or ignored one)", r.path)
		}
		if r.status != Works && r.reason == "" {
			t.Errorf("%s is %s without a reason", r.path, r.status)
		}
	}
	// The walk must see the whole API, not a corner of it.
	for _, want := range []string{"spec.hostPID", "container.securityContext.capabilities.drop", "spec.volumes[].downwardAPI.items[].mode", "container.livenessProbe"} {
		if !seen[want] {
			t.Errorf("the type walk missed %s", want)
		}
	}
}

func TestCheckFieldsOnWhatTheManifestSays(t *testing.T) {
	tests := []struct {
		name     string
		spec     string
		errs     []string // field paths refused
		warnings []string // field paths ignored
	}{
		{name: "plain", spec: oneContainer},
		{
			name: "probes, hooks and sidecars work; alpha probe fields are refused",
			spec: "  initContainers:\n  - {name: side, image: busybox, restartPolicy: Always}\n  containers:\n  - name: a\n    image: nginx\n    readinessProbe: {grpc: {port: 1, mode: TLS}}\n  - name: b\n    image: nginx\n    livenessProbe: {exec: {command: ['true']}}\n    lifecycle: {preStop: {exec: {command: ['true']}}, stopSignal: SIGUSR1}\n",
			errs: []string{"spec.containers[0].readinessProbe.grpc.mode", "spec.containers[1].lifecycle.stopSignal"},
		},
		{
			name:     "scheduling fields are ignored with a warning; priorityClassName works",
			spec:     "  schedulerName: custom\n  priorityClassName: system-node-critical\n  tolerations: [{operator: Exists}]\n  nodeSelector: {a: b}\n" + oneContainer,
			warnings: []string{"spec.schedulerName", "spec.tolerations"},
		},
		{
			name: "required node affinity is admitted; preferred and pod affinity are ignored",
			spec: "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms: [{matchExpressions: [{key: a, operator: In, values: [b]}], matchFields: [{key: metadata.name, operator: In, values: [n1]}]}]\n" +
				"      preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, preference: {matchExpressions: [{key: a, operator: Exists}]}}]\n" +
				"    podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: x}]}\n" + oneContainer,
			warnings: []string{"spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution", "spec.affinity.podAntiAffinity"},
		},
		{
			name: "values accepted and refused",
			spec: "  hostUsers: true\n  os: {name: linux}\n  setHostnameAsFQDN: false\n  containers:\n  - name: a\n    image: nginx\n    terminationMessagePath: /dev/termination-log\n    volumeMounts: [{name: v, mountPath: /v, mountPropagation: None}]\n    resources: {limits: {cpu: 1, memory: 1Gi, example.com/foo: 2}}\n  volumes: [{name: v, emptyDir: {}}]\n",
		},
		{
			name: "a windows pod is accepted: admission rejects it",
			spec: "  os: {name: windows}\n" + oneContainer,
		},
		{
			name: "values refused",
			spec: "  hostUsers: false\n  os: {name: darwin}\n  containers:\n  - name: a\n    image: nginx\n    volumeMounts: [{name: v, mountPath: /v, recursiveReadOnly: Enabled}]\n    resources: {limits: {nvidia.com/gpu: 1, hugepages-2Mi: 2Mi}}\n  volumes: [{name: v, emptyDir: {}}]\n",
			errs: []string{"spec.containers[0].resources.limits", "spec.os.name"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := mustDecode(t, podWith(tt.spec))
			var errs, warnings []string
			for _, f := range checkFields(pod, parseOptions{}) {
				if f.status == Refused {
					errs = append(errs, f.path)
				} else {
					warnings = append(warnings, f.path)
				}
			}
			slices.Sort(errs)
			slices.Sort(warnings)
			slices.Sort(tt.errs)
			slices.Sort(tt.warnings)
			if !slices.Equal(errs, tt.errs) || !slices.Equal(warnings, tt.warnings) {
				t.Errorf("refused %v ignored %v, want refused %v ignored %v", errs, warnings, tt.errs, tt.warnings)
			}
		})
	}
}

// A Pod read back from a cluster (kubectl get -o yaml) carries what the API
// server set: each such field is a warning, generateName an error.
func TestCheckFieldsOnMetadataAndStatus(t *testing.T) {
	in := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  generateName: web-\n  labels: {a: b}\n  resourceVersion: '7'\n" +
		"  creationTimestamp: null\n  ownerReferences: [{apiVersion: v1, kind: Node, name: n1, uid: u}]\nspec:\n" + oneContainer + "status: {phase: Running}\n"
	var got []string
	for _, f := range checkFields(mustDecode(t, in), parseOptions{}) {
		got = append(got, string(f.status)+" "+f.path)
	}
	want := []string{"refused metadata.generateName", "ignored metadata.resourceVersion", "ignored metadata.ownerReferences", "ignored status"}
	if !slices.Equal(got, want) {
		t.Errorf("findings %q, want %q", got, want)
	}
}

// Defaults never count as what the user wrote.
func TestDefaultedPodHasNoFindings(t *testing.T) {
	pod := mustDecode(t, podWith(oneContainer))
	ApplyDefaults(pod)
	res := parseManifest([]byte(podWith(oneContainer)), "web.yaml", "n1", "file:/x", time.Now(), parseOptions{})
	if len(res.errs) != 0 || len(res.warns) != 0 {
		t.Errorf("a plain pod gave errors %v warnings %v", res.errs, res.warns)
	}
}

// Errors and warnings name the line and column of the field's key.
func TestFieldErrorsPointAtTheirKey(t *testing.T) {
	in := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  schedulerName: x\n  containers:\n  - name: a\n    image: nginx\n  - name: b\n    image: nginx\n    envFrom: []\n    ports:\n    - containerPort: 99999\n"
	res := parseManifest([]byte(in), "web.yaml", "n1", "file:/x", time.Now(), parseOptions{})
	var got []string
	for _, e := range append(res.errs, res.warns...) {
		got = append(got, e.Error())
	}
	want := []string{
		"web.yaml:12:5: spec.containers[1].envFrom: not supported by noderun: " + ruleIndex["container.envFrom"].reason,
		"web.yaml:14:7: spec.containers[1].ports[0].containerPort: must be between 1 and 65535, inclusive",
		"web.yaml:6:3: spec.schedulerName: ignored: " + whyScheduling,
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var me *ManifestError
	if !errors.As(res.errs[0], &me) || me.Column != 5 {
		t.Errorf("column of the first error = %+v", me)
	}
}

// The field reference is generated from the lists, so it cannot drift:
// `make docs` (or go generate) rewrites it.
func TestFieldsReference(t *testing.T) {
	const path = "../docs/reference/fields.md"
	want := fieldsReference()
	got, err := os.ReadFile(path)
	if err == nil && string(got) == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is out of date (%v): run make docs", path, err)
}

func fieldsReference() string {
	return `# Pod fields

<!-- Generated from manifests/fields.go by ` + "`make docs`" + `; do not edit. -->

Every field path of the Kubernetes v1.37 Pod (` + "`k8s.io/api`" + ` v0.37: metadata, spec with its containers,
volumes, probes and security contexts, status) is in exactly one of three lists
(` + "`manifests/fields.go`" + `): it **works** as in Kubernetes, it is **refused** (the pod is an error naming
the field, in ` + "`noderun check`" + `, the log and ` + "`GET /manifests`" + `), or it is **ignored**: accepted with no
effect, on purpose (a warning in ` + "`noderun check`" + `, which still exits 0, and one log line). The fields
that refer to ConfigMaps and Secrets are **opt-in**: they work with ` + "`--local-config-objects`" + ` (from
ConfigMap and Secret documents in the manifest sources) and are refused without it, in the kubelet's
words for static pods. A test walks the types by reflection and fails naming every field path in no
list and every listed path that no longer exists, so an upgrade of the Kubernetes API cannot add a
field that is silently ignored. A refused or ignored field covers the fields below it. Container
fields hold for init and app
containers alike (` + "`spec.[init]containers[]`" + `).

` + fieldTable()
}

// fieldTable renders the lists as a Markdown table, in the
// lists' order; container fields hold for init and app containers alike.
func fieldTable() string {
	var b strings.Builder
	b.WriteString("| field | noderun | why |\n| --- | --- | --- |\n")
	for _, r := range fieldRules {
		path := r.path
		if rest, ok := strings.CutPrefix(path, "container."); ok {
			path = "spec.[init]containers[]." + rest
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", path, r.status, strings.ReplaceAll(r.reason, "|", "\\|"))
	}
	return b.String()
}

// The feature gates Kubernetes v1.37.2 has off by default that gate Pod
// fields (pkg/features/kube_features.go, pkg/api/pod/util.go's
// dropDisabled* at v1.37.2). Only these may make a field "alpha": a gate
// that is beta-and-on or GA there is no reason to refuse a field.
var gatesOffInV137 = []string{
	"AtomicWriteVolumeUserFields", "ContainerStopSignals", "EmptyDirVolumeMode", "EvictionRequestAPI",
	"GRPCContainerProbeTLS", "H2CContainerProbe", "VolumeBindMountOptions",
}

func TestAlphaRefusalsNameAGateOffInV137(t *testing.T) {
	for _, r := range fieldRules {
		if !strings.Contains(r.reason, "alpha") {
			continue
		}
		gate, ok := strings.CutPrefix(r.reason, "alpha in Kubernetes v1.37 (the ")
		gate, _, _ = strings.Cut(gate, " ")
		if !ok || !slices.Contains(gatesOffInV137, gate) {
			t.Errorf("%s: %q does not name a feature gate off by default in v1.37", r.path, r.reason)
		}
	}
	pod := mustDecode(t, podWith("  containers:\n  - name: a\n    image: nginx\n    lifecycle: {stopSignal: SIGUSR1}\n"))
	errs, _ := fieldErrors(checkFields(pod, parseOptions{}))
	want := "spec.containers[0].lifecycle.stopSignal: not supported by noderun: alpha in Kubernetes v1.37 (the ContainerStopSignals feature gate, off by default)"
	if len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("stopSignal: %v, want %s", errs, want)
	}
}

// README.md's field summary is generated from the lists too, between its
// markers: `make docs` rewrites it.
func TestReadmeFieldSummary(t *testing.T) {
	const path, begin, end = "../README.md", "<!-- fields:begin -->\n", "<!-- fields:end -->\n"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	head, rest, ok1 := strings.Cut(string(b), begin)
	_, tail, ok2 := strings.Cut(rest, end)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q", path, begin, end)
	}
	want := head + begin + fieldSummary() + end + tail
	if string(b) == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's field summary is out of date: run make docs", path)
}

// fieldSummary counts the lists and names the refused fields by why.
func fieldSummary() string {
	count := map[FieldStatus]int{}
	groups := map[string][]string{}
	for _, r := range fieldRules {
		count[r.status]++
		if r.status == Refused {
			why := refusalKind(r.reason)
			path, _ := strings.CutPrefix(r.path, "container.")
			if path != r.path {
				path = "[init]containers[]." + path
			}
			groups[why] = append(groups[why], "`"+path+"`")
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Of the %d field paths of the Kubernetes v1.37 Pod in [the field table](docs/reference/fields.md)\n"+
		"(a refused or ignored one covers its subtree), %d work as in Kubernetes, %d (ConfigMap and Secret\n"+
		"references) work with `--local-config-objects` and are refused without it, %d are accepted with no\n"+
		"effect and a warning, and %d are refused:\n\n",
		len(fieldRules), count[Works], count[OptIn], count[Ignored], count[Refused])
	b.WriteString("| refused because | fields |\n| --- | --- |\n")
	for _, why := range refusalKinds {
		if len(groups[why]) > 0 {
			fmt.Fprintf(&b, "| %s | %s |\n", why, strings.Join(groups[why], ", "))
		}
	}
	return b.String()
}

var refusalKinds = []string{
	"static pods may not reference API objects, as on the kubelet v1.37",
	"off by default in Kubernetes v1.37 (feature gates)",
	"not implemented by noderun (yet)",
	"other reasons (see the table)",
}

func refusalKind(reason string) string {
	switch {
	case strings.Contains(reason, "static pods may not reference") || strings.Contains(reason, "static pods do not support"):
		return refusalKinds[0]
	case strings.Contains(reason, "off by default"):
		return refusalKinds[1]
	case strings.HasPrefix(reason, whyNotHere) || strings.HasPrefix(reason, "pod-level resources: "+whyNotHere):
		return refusalKinds[2]
	}
	return refusalKinds[3]
}

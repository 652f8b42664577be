package manifests

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// conformanceDir holds the real-world manifests the e2e tests run, in the
// repository so a fresh clone has them.
const conformanceDir = "../e2e/testdata/conformance"

func TestConformanceManifests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(conformanceDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no conformance manifests in %s: %v", conformanceDir, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			pods, err := Decode(data)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if len(pods) != 1 {
				t.Fatalf("got %d pods, want 1", len(pods))
			}
			ApplyDefaults(pods[0])
			if errs := Validate(pods[0]); len(errs) > 0 {
				t.Fatalf("Validate: %v", errors.Join(errs...))
			}
		})
	}
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string // pod names
		wantErr []string // error strings, in order
	}{
		{
			name: "block style",
			in:   "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\nspec:\n  containers:\n  - name: c\n    image: busybox\n",
			want: []string{"a"},
		},
		{
			name: "flow style with trailing commas after a leading separator",
			in:   "---\n{\n  apiVersion: \"v1\",\n  kind: \"Pod\",\n  metadata: {name: \"a\",},\n  spec: {containers: [{name: \"c\", image: \"busybox\",}],},\n}\n",
			want: []string{"a"},
		},
		{
			name: "JSON",
			in:   `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}`,
			want: []string{"a"},
		},
		{
			name: "multi-document with empty and comment-only documents",
			in: "---\n# nothing here\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\n\n---\n" +
				"--- {apiVersion: v1, kind: Pod, metadata: {name: b}}\n",
			want: []string{"a", "b"},
		},
		{
			name: "PodList",
			in:   "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: a}\n- kind: Pod\n  apiVersion: v1\n  metadata: {name: b}\n",
			want: []string{"a", "b"},
		},
		{
			name: "empty input",
			in:   "\n# just a comment\n",
		},
		{
			name:    "unknown field names its path and line",
			in:      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\nspec:\n  containers:\n  - name: c\n    image: busybox\n    comand: [sh]\n",
			wantErr: []string{"line 9:5: spec.containers[0].comand: unknown field"},
		},
		{
			name:    "unknown field in a later document counts lines from the file's top",
			in:      "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: b\n  lables: {x: y}\n",
			want:    []string{"a"},
			wantErr: []string{"line 9:3: metadata.lables: unknown field"},
		},
		{
			name:    "field names are case-sensitive",
			in:      "apiVersion: v1\nkind: Pod\nmetadata: {Name: a}\n",
			wantErr: []string{"line 3:12: metadata.Name: unknown field"},
		},
		{
			name:    "duplicate key",
			in:      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  name: b\n",
			wantErr: []string{`line 5: invalid YAML: unmarshal errors: line 5: key "name" already set in map`},
		},
		{
			name:    "YAML syntax error in second document",
			in:      "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: v1\nkind: [Pod\n",
			want:    []string{"a"},
			wantErr: []string{"line 6: invalid YAML: line 6: did not find expected ',' or ']'"},
		},
		{
			name:    "wrong kind",
			in:      "# a deployment\napiVersion: v1\nkind: Deployment\n",
			wantErr: []string{`line 2: kind: unsupported kind "Deployment" (want Pod or PodList)`},
		},
		{
			name:    "wrong apiVersion",
			in:      "apiVersion: apps/v1\nkind: Pod\n",
			wantErr: []string{`line 1: apiVersion: unsupported apiVersion "apps/v1" (want v1)`},
		},
		{
			name:    "not an object",
			in:      "- a\n- b\n",
			wantErr: []string{"line 1: document must be an object with apiVersion and kind"},
		},
		{
			name:    "wrong type",
			in:      "apiVersion: v1\nkind: Pod\nspec: {containers: [{name: c, ports: [{containerPort: http}]}]}\n",
			wantErr: []string{"line 3:40: spec.containers[0].ports[0].containerPort: must be an integer that fits int32, not the string \"http\""},
		},
		{
			name:    "PodList item of another kind",
			in:      "apiVersion: v1\nkind: PodList\nitems:\n- kind: Service\n  metadata: {name: a}\n",
			wantErr: []string{"line 1: items[0].kind: PodList items must be v1 Pods"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods, err := Decode([]byte(tt.in))
			var got []string
			for _, p := range pods {
				got = append(got, p.Name)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("pods = %v, want %v", got, tt.want)
			}
			if gotErr := errorStrings(err); strings.Join(gotErr, "\n") != strings.Join(tt.wantErr, "\n") {
				t.Errorf("errors =\n%s\nwant\n%s", strings.Join(gotErr, "\n"), strings.Join(tt.wantErr, "\n"))
			}
		})
	}
}

// errorStrings unpacks a joined error into its parts' texts, checking each
// is a *ManifestError.
func errorStrings(err error) []string {
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var out []string
	for _, e := range errs {
		var me *ManifestError
		if !errors.As(e, &me) {
			out = append(out, "not a *ManifestError: "+e.Error())
			continue
		}
		out = append(out, e.Error())
	}
	return out
}

func TestManifestErrorString(t *testing.T) {
	tests := []struct {
		name string
		in   ManifestError
		want string
	}{
		{"all parts", ManifestError{File: "pods/web.yaml", Line: 14, Field: "spec.containers[0].comand", Message: "unknown field"}, "pods/web.yaml:14: spec.containers[0].comand: unknown field"},
		{"no line", ManifestError{File: "a.yaml", Message: "m"}, "a.yaml: m"},
		{"no file", ManifestError{Line: 3, Message: "m"}, "line 3: m"},
		{"field only", ManifestError{Field: "spec", Message: "m"}, "spec: m"},
		{"cause as message", ManifestError{File: "a.yaml", Err: ErrTooLarge}, "a.yaml: manifest file is larger than 10 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.in.Error(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// Every value of the wrong type is reported, each at its key, in YAML and
// in JSON alike.
func TestTypeErrorsAtTheirKeys(t *testing.T) {
	yamlDoc := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: nginx\n    ports:\n    - containerPort: \"80\"\n    resources:\n      limits: {memory: 12XB}\n  - name: b\n    image: nginx\n    tty: yes-please\n  hostNetwork: [true]\n"
	jsonDoc := "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"Pod\",\n  \"metadata\": {\"name\": \"web\"},\n  \"spec\": {\n    \"containers\": [{\n      \"name\": \"app\",\n      \"image\": \"nginx\",\n      \"ports\": [{\"containerPort\": \"80\"}]\n    }],\n    \"restartPolicy\": 3\n  }\n}\n"
	for _, tt := range []struct {
		name, in string
		want     []string
	}{
		{"yaml", yamlDoc, []string{
			`line 10:7: spec.containers[0].ports[0].containerPort: must be an integer that fits int32, not the string "80"`,
			`line 12:16: spec.containers[0].resources.limits.memory: quantities must match the regular expression`,
			`line 15:5: spec.containers[1].tty: must be true or false, not the string "yes-please"`,
			`line 16:3: spec.hostNetwork: must be true or false, not a list`,
		}},
		{"json", jsonDoc, []string{
			`line 9:18: spec.containers[0].ports[0].containerPort: must be an integer that fits int32, not the string "80"`,
			`line 11:5: spec.restartPolicy: must be a string, not 3`,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.in))
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				got = append(got, e.Error())
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("error %d = %q, want prefix %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

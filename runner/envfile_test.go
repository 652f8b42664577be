package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// The env file format as the kubelet v1.37 parses it (pkg/kubelet/util/env).
func TestEnvFileValue(t *testing.T) {
	for _, tc := range []struct {
		name, in, key, want, wantErr string
	}{
		{name: "plain", in: "A='1'\nB='2'\n", key: "B", want: "2"},
		{name: "literal, no expansion or escapes", in: `A='$HOME \n "x"'`, key: "A", want: `$HOME \n "x"`},
		{name: "comments, blank lines, indentation", in: "# c\n\n  \t\n  A='1' # trailing\n", key: "A", want: "1"},
		{name: "multi-line", in: "A='one\ntwo\n'\nB='x'", key: "A", want: "one\ntwo\n"},
		{name: "first assignment wins", in: "A='1'\nA='2'\n", key: "A", want: "1"},
		{name: "not there", in: "A='1'\n", key: "B", want: ""},
		{name: "blank after = sets it empty", in: "A= '1'\n", key: "A", want: ""},
		{name: "blank after = on another key is skipped", in: "A= junk junk\nB='2'", key: "B", want: "2"},
		{name: "found before a bad line", in: "A='1'\nnot a line\n", key: "A", want: "1"},
		{name: "missing =", in: "A\n", key: "A", wantErr: "line 1: missing '='"},
		{name: "space before =", in: "A ='1'\n", key: "A", wantErr: "line 1: whitespace before '=' is not allowed"},
		{name: "empty name", in: "='1'\n", key: "A", wantErr: "line 1: empty variable name"},
		{name: "unquoted", in: "B='2'\nA=1\n", key: "A", wantErr: "line 2: value must be enclosed in single quotes"},
		{name: "double quotes", in: `A="1"`, key: "A", wantErr: "line 1: value must be enclosed in single quotes"},
		{name: "content after quote", in: "A='1' x\n", key: "A", wantErr: "line 1: unexpected content after closing quote"},
		{name: "unclosed", in: "B='2'\nA='1\n2\n", key: "A", wantErr: "line 2: unclosed single quote"},
	} {
		got, err := envFileValue(strings.NewReader(tc.in), tc.key)
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%s: %q, %v; want error %q", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// fileKeyValue reads from the pod's emptyDir and fails as the kubelet does:
// a missing key (unless optional), a missing file; and never follows a
// link a container planted out of the volume.
func TestFileKeyValue(t *testing.T) {
	podDir := t.TempDir()
	dir := emptyDirPath(podDir, "cfg")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "host-file")
	for path, data := range map[string]string{"sub/app.env": "DB='db:5432'\n", secret: "DB='host'\n"} {
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(secret, filepath.Join(dir, "escape.env")); err != nil {
		t.Fatal(err)
	}
	ref := func(path, key string, optional bool) *v1.FileKeySelector {
		return &v1.FileKeySelector{VolumeName: "cfg", Path: path, Key: key, Optional: ptr.To(optional)}
	}
	if v, skip, err := fileKeyValue(podDir, ref("sub/app.env", "DB", false)); v != "db:5432" || skip || err != nil {
		t.Errorf("found: %q %v %v", v, skip, err)
	}
	if _, skip, err := fileKeyValue(podDir, ref("sub/app.env", "NOPE", true)); !skip || err != nil {
		t.Errorf("optional and missing: skip %v, %v", skip, err)
	}
	_, _, err := fileKeyValue(podDir, ref("sub/app.env", "NOPE", false))
	if want := `environment variable key "NOPE" not found in file "` + dir + `/sub/app.env"`; err == nil || err.Error() != want {
		t.Errorf("missing key: %v, want %s", err, want)
	}
	for _, path := range []string{"gone.env", "escape.env", "sub"} {
		if _, _, err := fileKeyValue(podDir, ref(path, "DB", true)); err == nil || !strings.HasPrefix(err.Error(), "couldn't parse env file: ") {
			t.Errorf("%s: %v, want the kubelet's couldn't parse env file", path, err)
		}
	}
}

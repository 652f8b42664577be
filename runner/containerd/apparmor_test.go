package containerd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"text/template"

	"github.com/containerd/containerd/contrib/apparmor"
)

// TestDefaultAppArmorProfile: the profile withDefaultAppArmorProfile
// loads is containerd's, byte for byte: for this host, as containerd's
// DumpDefaultProfile writes it, and for every branch of its template,
// executed from containerd's source of the version go.mod requires.
func TestDefaultAppArmorProfile(t *testing.T) {
	want, err := apparmor.DumpDefaultProfile(appArmorDefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	if got := hostAppArmorData(appArmorDefaultProfile).text(); got != want {
		t.Errorf("this host's profile differs from containerd's:\n%s\nwant:\n%s", got, want)
	}

	tmpl := template.Must(template.New("profile").Parse(containerdProfileTemplate(t)))
	// containerd's data, with its field names.
	type data struct {
		Abi, Name                  string
		Imports, InnerImports      []string
		DaemonProfile, RootlessKit string
	}
	for _, p := range []appArmorData{
		{name: "cri-containerd.apparmor.d", imports: []string{"@{PROC}=/proc/"}, daemon: "unconfined"},
		{name: "p", abi: "abi/3.0", imports: []string{"#include <tunables/global>"}, innerImport: []string{"#include <abstractions/base>"},
			daemon: "containerd", rootlessKit: "/usr/bin/rootlesskit"},
		{name: "p", imports: []string{"a", "b"}, innerImport: []string{"c", "d"}, daemon: "x"},
	} {
		var b strings.Builder
		d := data{p.abi, p.name, p.imports, p.innerImport, p.daemon, p.rootlessKit}
		if err := tmpl.Execute(&b, d); err != nil {
			t.Fatal(err)
		}
		if got := p.text(); got != b.String() {
			t.Errorf("%+v:\n%s\nwant:\n%s", p, got, b.String())
		}
	}
}

// containerdProfileTemplate is the default profile's template in the
// source of containerd's contrib/apparmor.
func containerdProfileTemplate(t *testing.T) string {
	t.Helper()
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/containerd/containerd").Output()
	if err != nil {
		t.Fatalf("go list containerd's module: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "contrib/apparmor/template.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "const defaultTemplate = `")
	tmpl, _, ok2 := strings.Cut(rest, "`")
	if !ok || !ok2 {
		t.Fatal("containerd's contrib/apparmor/template.go has no defaultTemplate constant")
	}
	return tmpl
}

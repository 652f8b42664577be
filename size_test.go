package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/noderun/noderun/internal/testenv"
)

// TestNoMethodsByName: nothing in noderun's binary calls methods by a name
// known only when it runs (reflect's Method and MethodByName, as
// text/template's execution does). Where one is reachable the linker keeps
// every exported method of every type, 4.78 MB of the binary's 30 MiB
// budget (make size-check); the failure names the path that reaches it.
func TestNoMethodsByName(t *testing.T) {
	if testing.Short() {
		t.Skip("links noderun")
	}
	if testenv.Emulated() {
		t.Skip("the native run links the same program")
	}
	cmd := exec.Command("go", "build", "-tags", "grpcnotrace,urfave_cli_no_docs", "-ldflags=-dumpdep",
		"-o", filepath.Join(t.TempDir(), "noderun"), ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%.2000s", err, out)
	}
	// Each line "from -> to" marks to reachable, from the first line
	// naming it; flags such as <ReflectMethod> follow a name.
	flags := regexp.MustCompile(` <[A-Za-z]+>`)
	parent := map[string]string{}
	var found []string
	for _, line := range strings.Split(string(out), "\n") {
		from, to, ok := strings.Cut(line, " -> ")
		if !ok {
			continue
		}
		name := flags.ReplaceAllString(to, "")
		if _, seen := parent[name]; seen {
			continue
		}
		parent[name] = flags.ReplaceAllString(from, "")
		if strings.Contains(to, "<ReflectMethod>") {
			found = append(found, name)
		}
	}
	for _, name := range found {
		path := []string{name}
		for p := parent[name]; p != "" && p != "_" && len(path) < 30; p = parent[p] {
			path = append(path, p)
		}
		t.Errorf("%s calls methods by name, reached by:\n\t%s", name, strings.Join(path[1:], "\n\t"))
	}
}

package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestPackageDependencies keeps the architecture honest: leaves import no
// noderun package, runner imports only manifests, and so on.
func TestPackageDependencies(t *testing.T) {
	const mod = "github.com/noderun/noderun"
	allowed := map[string][]string{
		"manifests":                     {"internal/atomicfile", "internal/bandwidth", "internal/secretfile"},
		"cni":                           {"internal/atomicfile", "internal/bandwidth"},
		"crilog":                        nil,
		"systemd":                       {"internal/atomicfile"}, // Install replaces the binary and unit file atomically; knows no pod
		"internal/ociimage":             nil,
		"internal/testenv":              nil,
		"runner":                        {"manifests", "crilog", "runner/prober", "internal/expansion", "internal/atomicfile", "internal/bandwidth", "internal/cgroups", "runner/volume"},
		"runner/volume":                 nil, // hostile-path-safe file operations; knows no pod worker
		"runner/prober":                 {"internal/expansion"},
		"internal/expansion":            nil,
		"internal/atomicfile":           nil,
		"internal/bandwidth":            nil,
		"runner/containerd":             {"runner", "manifests", "crilog", "internal/cgroups", "internal/dirpoll", "internal/secretfile", "internal/execio"},
		"runner/containerd/daemon":      {"runner/volume", "internal/atomicfile"}, // finds, starts, supervises containerd; knows no pod (RemoveTree: a managed daemon's dirs hold mounts)
		"runner/sandbox":                {"runner", "cni", "internal/dirpoll"},    // implements runner.Network; runner and cni may not import it
		"internal/cgroups":              nil,
		"internal/dirpoll":              nil,
		"internal/layout":               {"kubeapi", "runner", "runner/volume"}, // the node's dirs: names the paths kubeapi and runner own (CredentialsDir, ServerFile, StatusSocket, SandboxesDir) so each is spelled once, resolves and removes through runner/volume's ResolvePath and RemoveTree; starts nothing, and kubeapi and runner may not import it
		"internal/kernel":               nil,
		"internal/memtrim":              nil, // a leaf: the daemon, the collector and log drivers call it
		"internal/secretfile":           nil, // a leaf: the one mode check for files holding secrets, which manifests and runner/containerd share
		"internal/execio":               nil, // an exec's streams, from kubeapi to runner/containerd as they are: a leaf, so neither imports the other
		"kubeapi":                       {"crilog", "manifests", "internal/atomicfile", "internal/execio"},
		"e2e":                           nil, // tests only
		"bench":                         {"cni", "crilog", "internal/logdriver", "internal/ociimage", "internal/testnode", "runner/containerd", "runner/containerd/daemon"},
		"internal/logdriver":            {"crilog", "internal/atomicfile", "internal/memtrim"}, // memtrim: InstallOrSelf gives back the pages reading the embedded driver made resident
		"internal/logdriver/driver":     {"crilog"},
		"internal/ociimage/cmd/mkimage": {"internal/ociimage"},
		// client commands talk to the node over its two APIs only (and
		// hand exec its streams as the API client takes them)
		"internal/cli": {"kubeapi", "manifests", "internal/atomicfile", "internal/execio"},
		// The node under test of e2e and bench: it builds noderun, runs it
		// on a containerd of its own and cleans up as noderun would.
		"internal/testnode": {"internal/logdriver", "internal/ociimage", "runner/containerd/daemon"},
	}
	// Production imports only: tests may use any helper package.
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, ok := strings.CutPrefix(fields[0], mod+"/")
		if !ok {
			continue // the main package wires everything
		}
		allow, known := allowed[pkg]
		if !known {
			t.Errorf("package %s has no entry in the dependency rules", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if dep, ok := strings.CutPrefix(imp, mod+"/"); ok && !slices.Contains(allow, dep) {
				t.Errorf("%s imports %s; allowed: %v", pkg, dep, allow)
			}
		}
	}
}

// TestBinaryLinksNoKubernetesClient keeps client-go, kubectl and the API
// server's libraries out of noderun's binary (megabytes each); the e2e
// tests build kubectl from a module of their own (e2e/kubectl).
func TestBinaryLinksNoKubernetesClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"k8s.io/client-go", "k8s.io/kubectl", "k8s.io/apiserver", "k8s.io/kubernetes", "k8s.io/component-base"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("noderun links %s", dep)
			}
		}
	}
}

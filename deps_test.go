package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// rule is what a package may import of noderun's own, and why.
type rule struct {
	imports []string
	why     string
}

// depRules holds one rule for every package, main included: a package
// without one fails the test, so each new package states its place.
var depRules = map[string]rule{
	".": {[]string{"cni", "crilog", "internal/admission", "internal/apipods", "internal/atomicfile", "internal/cgroups", "internal/cli", "internal/kernel", "internal/layout",
		"internal/logdriver", "internal/memtrim", "internal/nodelog", "internal/podstats", "kubeapi", "manifests", "mirror", "runner", "runner/containerd", "runner/containerd/daemon",
		"runner/sandbox", "systemd"},
		"wiring and dispatch: builds the parts and hands each what it needs; never a test harness or a child program's package"},

	// The leaves: what they do needs no engine.
	"manifests":           {[]string{"internal/admission", "internal/atomicfile", "internal/bandwidth", "internal/secretfile"}, "manifests to pods: runs nothing, so any part may use it"},
	"cni":                 {[]string{"internal/atomicfile", "internal/bandwidth"}, "namespaces and libcni: knows no pod worker, so the sandbox and bench both use it"},
	"crilog":              {nil, "the log collector and driver run in processes of their own: they link nothing of the daemon"},
	"systemd":             {[]string{"internal/atomicfile"}, "sd_notify over an Engine interface of its own, graceful node shutdown over logind's D-Bus API with a ShutdownPods interface of its own (atomic drop-in writes), and install (atomic replacement of the binary and unit): knows no pod"},
	"internal/execio":     {nil, "an exec's streams, from kubeapi to runner/containerd as they are: a leaf, so neither imports the other"},
	"internal/expansion":  {nil, "$(VAR) syntax, shared by runner and runner/prober"},
	"internal/atomicfile": {nil, "crash-safe writes for every package that keeps state"},
	"internal/bandwidth":  {nil, "the annotations as the kubelet reads them, for manifests (validation) and cni (applying)"},
	"internal/cgroups":    {nil, "cgroup paths and pod and QoS limits for both drivers and hierarchies: runner decides, runner/containerd applies"},
	"internal/dirpoll":    {nil, "a stand-in for inotify, for whoever watches a directory"},
	"internal/podstats":   {[]string{"internal/cgroups"}, "usage read on request from the pods' cgroups, netns and dirs: kubeapi serves it, main tells it where each pod is; knows no engine"},
	"internal/apipods":    {[]string{"manifests", "internal/atomicfile"}, "the API-made debugger pods as a manifest source: reads the engine's statuses through an interface of its own; main hands it to kubeapi"},
	"internal/nodelog":    {nil, "the kubelet's node log query over the log dir and journalctl: main hands it to kubeapi as a handler; knows no pod"},
	"internal/kernel":     {nil, "the minimum kernel, checked by main at start"},
	"internal/memtrim":    {nil, "the daemon, the collector and log drivers call it"},
	"internal/admission":  {nil, "the kubelet's admission decision and node labels, for runner (deciding), main (--node-labels) and check (warnings)"},
	"internal/secretfile": {nil, "the one mode check for files holding secrets, which manifests and runner/containerd share"},

	// The engine and what implements its interfaces.
	"runner": {[]string{"manifests", "crilog", "runner/prober", "runner/volume", "internal/admission", "internal/expansion", "internal/atomicfile", "internal/bandwidth", "internal/cgroups"},
		"the sync engine declares Runtime and Network and imports no implementation of them (crilog: a log's last lines for FallbackToLogsOnError)"},
	"runner/prober": {[]string{"internal/expansion"}, "probes and hooks reach containers through an Execer: they know no runtime"},
	"runner/volume": {nil, "hostile-path-safe file operations; knows no pod worker"},
	"runner/containerd": {[]string{"runner", "manifests", "crilog", "internal/cgroups", "internal/dirpoll", "internal/secretfile", "internal/execio"},
		"implements runner.Runtime; never the sandbox or the daemon's lifecycle"},
	"runner/containerd/daemon": {[]string{"runner/volume", "internal/atomicfile"},
		"finds, starts and supervises containerd; knows no pod (RemoveTree: a managed daemon's dirs hold mounts)"},
	"runner/sandbox": {[]string{"runner", "cni", "internal/dirpoll"}, "implements runner.Network; runner and cni may not import it"},

	// The node's faces.
	"kubeapi": {[]string{"crilog", "manifests", "internal/atomicfile", "internal/execio", "internal/podstats"},
		"reads the engine only through its Backend and Streams interfaces, never runner (podstats: the usage it serves, through Usage)"},
	"mirror": {[]string{"manifests"},
		"mirror mode: reads the engine through its Source interface and writes only to the API server, so it can slow no pod (manifests: the static pods' annotation keys)"},
	"internal/cli": {[]string{"kubeapi", "manifests", "internal/admission", "internal/atomicfile", "internal/execio"},
		"client commands talk to the node over its two APIs only (and hand exec its streams as the API client takes them)"},
	"internal/layout": {[]string{"kubeapi", "runner", "runner/volume"},
		"the node's dirs: names the paths kubeapi and runner own so each is spelled once, resolves and removes through runner/volume; starts nothing, and kubeapi and runner may not import it"},
	"internal/logdriver": {[]string{"crilog", "internal/atomicfile", "internal/memtrim"},
		"carries the driver program and installs it (memtrim: gives back the pages reading the embedded driver made resident)"},
	"internal/logdriver/driver": {[]string{"crilog"}, "the driver program alone: crilog's driver side, nothing more, to start fast"},

	// Tests, benchmarks and their tools: never imported by the binary.
	"internal/ociimage":             {nil, "image tarballs for examples and tests"},
	"internal/ociimage/cmd/mkimage": {[]string{"internal/ociimage"}, "the examples' image builder"},
	"internal/testenv":              {nil, "the skip-or-fail rule for tests with real prerequisites"},
	"internal/testnode": {[]string{"internal/logdriver", "internal/ociimage", "runner/containerd/daemon"},
		"the node under test of e2e and bench: it builds noderun, runs it on a containerd of its own and cleans up as noderun would"},
	"internal/testvm": {[]string{"internal/testnode"},
		"make test-vm's machine: builds the Debian image (with testnode's built containerd and runc), boots it with qemu, drives it over ssh"},
	"e2e":    {nil, "tests only: they drive the binary from outside"},
	"e2e/vm": {nil, "tests only: they drive the installed package inside a machine"},
	"bench": {[]string{"cni", "crilog", "internal/logdriver", "internal/ociimage", "internal/testnode", "runner/containerd", "runner/containerd/daemon"},
		"the floor is built from the same parts noderun uses (containerd's client, libcni), measured beside the binary"},
}

// TestPackageDependencies keeps the architecture honest: every package,
// main included, imports of noderun's own only what its rule allows.
func TestPackageDependencies(t *testing.T) {
	const mod = "github.com/noderun/noderun"
	for pkg, r := range depRules {
		if r.why == "" {
			t.Errorf("the rule for %s gives no reason", pkg)
		}
	}
	// Production imports only: tests may use any helper package.
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := "."
		if fields[0] != mod {
			pkg = strings.TrimPrefix(fields[0], mod+"/")
		}
		seen[pkg] = true
		r, known := depRules[pkg]
		if !known {
			t.Errorf("package %s has no entry in the dependency rules", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if dep, ok := strings.CutPrefix(imp, mod+"/"); ok && !slices.Contains(r.imports, dep) {
				t.Errorf("%s imports %s; allowed: %v (%s)", pkg, dep, r.imports, r.why)
			}
		}
	}
	for pkg := range depRules {
		if !seen[pkg] {
			t.Errorf("a rule names %s, which is no package", pkg)
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

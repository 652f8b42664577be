// Package testenv holds the one rule every test with real prerequisites
// follows: skip when one is missing, except under CI=true, where a skip
// would hide that nothing was tested; and small helpers such tests share.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Require skips t when ok is false, or fails it when CI=true.
func Require(t testing.TB, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("missing prerequisite: %s", what)
	}
	t.Skipf("missing prerequisite: %s", what)
}

// RequireContainerd guards a test that starts a real containerd: skipped
// with -short, and Require's rule for root and the binary.
func RequireContainerd(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts containerd; skipped with -short")
	}
	Require(t, os.Geteuid() == 0, "root")
	_, err := exec.LookPath("containerd")
	Require(t, err == nil, "containerd on PATH (apt-get install containerd)")
}

// ShortTempDir is a temporary directory for unix sockets, whose paths must
// stay under 108 bytes (t.TempDir's may not), removed at cleanup.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "nrd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// WriteFile writes content to path, making its parent directories.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

package systemd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSystemctl puts a systemctl on PATH that appends its arguments to the
// returned log file, one call a line.
func fakeSystemctl(t *testing.T) (calls string) {
	t.Helper()
	dir := t.TempDir()
	calls = filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >> " + calls + "\n"
	if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return calls
}

func readCalls(t *testing.T, calls string) string {
	t.Helper()
	b, err := os.ReadFile(calls)
	if os.IsNotExist(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantFile(t *testing.T, path string, mode os.FileMode, content []byte) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != mode {
		t.Errorf("%s: mode %v, want %v", path, fi.Mode(), mode)
	}
	if content == nil {
		return
	}
	if got, err := os.ReadFile(path); err != nil {
		t.Fatal(err)
	} else if !bytes.Equal(got, content) {
		t.Errorf("%s: content differs from what was installed (%d bytes, want %d)", path, len(got), len(content))
	}
}

func TestInstallUnderSystemd(t *testing.T) {
	calls := fakeSystemctl(t)
	root := t.TempDir()
	bin := filepath.Join(t.TempDir(), "noderun-build")
	if err := os.WriteFile(bin, []byte("new binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	// An older install: install replaces its binary and unit.
	for _, f := range []string{"usr/bin/noderun", "lib/systemd/system/noderun.service"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	in := Installation{Root: root, Prefix: "/usr", UnitDir: "/lib/systemd/system", Binary: bin, Systemd: true}
	wantUnit, err := unitFor("/usr/bin/noderun")
	if err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 2; run++ { // the second run finds everything in place
		var out bytes.Buffer
		in.Out = &out
		if err := Install(in); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		wantFile(t, filepath.Join(root, "usr/bin/noderun"), 0o755, []byte("new binary"))
		wantFile(t, filepath.Join(root, "lib/systemd/system/noderun.service"), 0o644, []byte(wantUnit))
		wantFile(t, filepath.Join(root, "etc/noderun/pods"), os.ModeDir|0o755, nil)
		want := strings.Repeat("daemon-reload\nenable noderun.service\n", run)
		if got := readCalls(t, calls); got != want {
			t.Errorf("run %d: systemctl calls:\n%s\nwant:\n%s", run, got, want)
		}
		if !strings.Contains(out.String(), "systemctl start noderun") {
			t.Errorf("run %d: output does not say how to start it:\n%s", run, out.String())
		}
	}
	if !strings.Contains(wantUnit, "\nExecStart=/usr/bin/noderun --manifests /etc/noderun/pods\n") {
		t.Errorf("unit's ExecStart does not name the installed binary:\n%s", wantUnit)
	}
	entries, err := os.ReadDir(filepath.Join(root, "usr/bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("usr/bin holds %d entries, want only noderun (no temporary files left)", len(entries))
	}
}

// Without systemd, nothing is called and the steps left are printed.
func TestInstallWithoutSystemdPrintsSteps(t *testing.T) {
	calls := fakeSystemctl(t)
	root := t.TempDir()
	var out bytes.Buffer
	in := Installation{Root: root, Prefix: "/usr/local", UnitDir: "/etc/systemd/system", Binary: "/bin/sh", Out: &out}
	if err := Install(in); err != nil {
		t.Fatal(err)
	}
	wantFile(t, filepath.Join(root, "usr/local/bin/noderun"), 0o755, nil)
	wantFile(t, filepath.Join(root, "etc/systemd/system/noderun.service"), 0o644, nil)
	if got := readCalls(t, calls); got != "" {
		t.Errorf("systemctl called without systemd: %q", got)
	}
	for _, want := range []string{"systemctl daemon-reload", "systemctl enable noderun.service", "systemctl start noderun"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks the step %q:\n%s", want, out.String())
		}
	}
}

func TestInstallRefusesRelativePaths(t *testing.T) {
	err := Install(Installation{Root: t.TempDir(), Prefix: "usr", UnitDir: "/etc/systemd/system", Binary: "/bin/sh", Out: &bytes.Buffer{}})
	if err == nil || !strings.Contains(err.Error(), `--prefix "usr"`) {
		t.Fatalf("relative --prefix: %v, want an error naming it", err)
	}
}

// A failing systemctl is reported, with its output.
func TestInstallReportsSystemctlFailure(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	err := Install(Installation{Root: t.TempDir(), Prefix: "/usr", UnitDir: "/lib/systemd/system", Binary: "/bin/sh", Systemd: true, Out: &bytes.Buffer{}})
	if err == nil || !strings.Contains(err.Error(), "systemctl daemon-reload") || !strings.Contains(err.Error(), "Failed to connect to bus") {
		t.Fatalf("got %v, want the failed command and its output", err)
	}
}

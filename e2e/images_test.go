package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/noderun/noderun/internal/ociimage"
)

// builtImage is a test image tarball made once per test binary.
type builtImage struct {
	once sync.Once
	path string
	err  error
}

func (b *builtImage) get(t *testing.T, build func() (string, error)) string {
	t.Helper()
	requireE2E(t) // images go to the run's work dir, which -short has not made
	b.once.Do(func() { b.path, b.err = build() })
	if b.err != nil {
		t.Fatalf("test image: %v", b.err)
	}
	return b.path
}

// goBinary builds a static binary of a package in this module.
func goBinary(pkg, out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// busyboxWith is a busybox image named name with extra files, saved as a
// tarball in the suite's dir.
func busyboxWith(name, file string, files map[string]ociimage.File, cmd []string) (string, error) {
	img, err := ociimage.Busybox(name)
	if err != nil {
		return "", err
	}
	for p, f := range files {
		img.Files[p] = f
	}
	if cmd != nil {
		img.Cmd = cmd
	}
	path := filepath.Join(workDir, file)
	return path, ociimage.WriteFile(path, img)
}

var probeServerImage builtImage

// probeServerRef is busybox plus testdata/probeserver at /probeserver: a
// gRPC health server for probe tests.
const probeServerRef = "noderun.test/probeserver:1"

func probeServerTar(t *testing.T) string {
	return probeServerImage.get(t, func() (string, error) {
		bin := filepath.Join(workDir, "probeserver")
		if err := goBinary("./testdata/probeserver", bin); err != nil {
			return "", err
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			return "", err
		}
		return busyboxWith(probeServerRef, "probeserver.tar", map[string]ociimage.File{"/probeserver": ociimage.Regular(b, 0o755)}, nil)
	})
}

package secretfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A file any bit of group's or others' access opens is refused, with its
// mode; one only its owner may access is read, whatever the owner's bits.
func TestOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o610, 0o601, 0o720} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		f, err := Open(path)
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, ErrMode) || !strings.Contains(err.Error(), fmt.Sprintf("mode %#o ", mode)) {
			t.Errorf("mode %#o: %v; want ErrMode naming the mode", mode, err)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o400, 0o700} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		f, err := Open(path)
		if err != nil {
			t.Fatalf("mode %#o: %v", mode, err)
		}
		b, err := io.ReadAll(f)
		f.Close()
		if err != nil || string(b) != "s3cret" {
			t.Errorf("mode %#o: read %q, %v", mode, b, err)
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v, want ErrNotExist", err)
	}
}

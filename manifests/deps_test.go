package manifests

import (
	"go/build"
	"strings"
	"testing"
)

// manifests is a leaf: the runner and runtimes import it, never the reverse.
func TestImportsNoNoderunPackage(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if strings.HasPrefix(imp, "github.com/noderun/noderun") {
			t.Errorf("manifests imports %s; it must stay a leaf", imp)
		}
	}
}

// Package testenv holds the one rule every test with real prerequisites
// follows: skip when one is missing, except under CI=true, where a skip
// would hide that nothing was tested; and small helpers such tests share.
package testenv

import (
	"os"
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

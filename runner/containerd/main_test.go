package containerd

import (
	"fmt"
	"os"
	"testing"

	"github.com/noderun/noderun/crilog"
)

// TestMain lets the test binary stand in for noderun as the containers' log
// driver: containerd's shim runs it as `<binary> log-driver <path>`.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "log-driver" {
		if err := crilog.ServeFDs(os.Args[2], "", nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

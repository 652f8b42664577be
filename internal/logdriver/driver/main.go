// Command driver is the containers' log driver: containerd's shim runs it as
// `<path> log-driver <target>` at each container start, with the
// container's stdout, stderr and a ready pipe on fds 3, 4 and 5, and waits
// for it before `runc create` (crilog.ServeFDs). noderun embeds it
// (package logdriver) rather than running its own binary there because the
// wait is on the path of every start: this program starts in about 1.3 ms
// of CPU, noderun's binary, initialising all its packages, in 8.
package main

import (
	"fmt"
	"os"

	"github.com/noderun/noderun/crilog"
)

func main() {
	switch {
	case len(os.Args) == 3 && os.Args[1] == "log-driver":
		if err := crilog.ServeFDs(os.Args[2], "", nil); err != nil {
			fmt.Fprintln(os.Stderr, "log-driver:", err)
			os.Exit(1)
		}
	case len(os.Args) == 2 && os.Args[1] == "check":
		fmt.Print(crilog.CheckReply)
	default:
		fmt.Fprintln(os.Stderr, "usage: log-driver TARGET | check")
		os.Exit(2)
	}
}

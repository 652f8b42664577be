package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/noderun/noderun/internal/testnode"
)

// nodePSS is the proportional set size, in MiB, of every process a noderun
// node runs besides the containers: noderun, its logging (the log
// collector and any log driver still running), containerd and the shims. PSS shares each page among the processes mapping it, so
// the parts add up to what the node costs.
type nodePSS struct {
	noderun, logging, containerd, shims float64
	drivers                             int // log driver processes
}

func (p nodePSS) sum() float64 { return p.noderun + p.logging + p.containerd + p.shims }

// measurePSS finds the node's processes in /proc: noderun by PID, its log
// collector as noderun's binary run with "log-collector <its socket>", the
// log drivers as the driver it installed (or its binary) run with
// "log-driver", containerd by PID and the shims as those started for its
// socket.
func (b *bench) measurePSS() (nodePSS, error) {
	var out nodePSS
	procs, err := testnode.Processes()
	if err != nil {
		return out, err
	}
	noderun, ctrd := b.node.pid(), b.env.daemon.PID()
	collector := b.node.collectorSocket()
	for _, pr := range procs {
		pid, args := pr.PID, pr.Args
		var into *float64
		switch {
		case pid == noderun:
			into = &out.noderun
		case pid == ctrd:
			into = &out.containerd
		case len(args) > 1 && args[1] == "log-driver" && (args[0] == b.env.bin || filepath.Dir(args[0]) == filepath.Join(b.node.stateDir, "bin")):
			into = &out.logging
			out.drivers++
		case len(args) == 3 && args[0] == b.env.bin && args[1] == "log-collector" && args[2] == collector:
			into = &out.logging
		case len(args) > 0 && filepath.Base(args[0]) == "containerd-shim-runc-v2" && slices.Contains(args, b.env.daemon.Address()):
			into = &out.shims
		default:
			continue
		}
		kib, err := pssKiB(pid)
		if err != nil {
			continue // ended meanwhile
		}
		*into += float64(kib) / 1024
	}
	return out, nil
}

// pssKiB reads a process's Pss from /proc/<pid>/smaps_rollup.
func pssKiB(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no Pss in /proc/%d/smaps_rollup", pid)
}

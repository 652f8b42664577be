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

// measurePSS is the PSS of the node's processes (nodeProcs).
func (b *bench) measurePSS() (nodePSS, error) {
	var out nodePSS
	parts, err := b.nodeProcs()
	if err != nil {
		return out, err
	}
	for part, into := range map[string]*float64{partAgent: &out.noderun, partLogging: &out.logging, partContainerd: &out.containerd, partShims: &out.shims} {
		for _, pid := range parts[part] {
			if kib, err := pssKiB(pid); err == nil { // else ended meanwhile
				*into += float64(kib) / 1024
			}
		}
	}
	out.drivers = len(parts[partDrivers])
	return out, nil
}

// The parts of a node's processes.
const (
	partAgent      = "agent"
	partLogging    = "logging"
	partDrivers    = "log drivers" // within partLogging, to count them
	partContainerd = "containerd"
	partShims      = "shims"
)

// nodeProcs finds the node's processes in /proc: noderun by PID, its log
// collector as noderun's binary run with "log-collector <its socket>", the
// log drivers as the driver it installed (or its binary) run with
// "log-driver", containerd by PID and the shims as those started for its
// socket in noderun's namespace.
func (b *bench) nodeProcs() (map[string][]int, error) {
	procs, err := testnode.Processes()
	if err != nil {
		return nil, err
	}
	out := map[string][]int{}
	noderun, ctrd := b.node.pid(), b.env.daemon.PID()
	collector := b.node.collectorSocket()
	for _, pr := range procs {
		pid, args := pr.PID, pr.Args
		switch {
		case pid == noderun:
			out[partAgent] = append(out[partAgent], pid)
		case pid == ctrd:
			out[partContainerd] = append(out[partContainerd], pid)
		case len(args) > 1 && args[1] == "log-driver" && (args[0] == b.env.bin || filepath.Dir(args[0]) == filepath.Join(b.node.stateDir, "bin")):
			out[partLogging] = append(out[partLogging], pid)
			out[partDrivers] = append(out[partDrivers], pid)
		case len(args) == 3 && args[0] == b.env.bin && args[1] == "log-collector" && args[2] == collector:
			out[partLogging] = append(out[partLogging], pid)
		case isShim(args, b.env.daemon.Address(), noderunNS):
			out[partShims] = append(out[partShims], pid)
		}
	}
	return out, nil
}

// isShim tells a runc shim started by the containerd at address for
// namespace ns (any namespace if ns is empty).
func isShim(args []string, address, ns string) bool {
	if len(args) == 0 || filepath.Base(args[0]) != "containerd-shim-runc-v2" || !slices.Contains(args, address) {
		return false
	}
	i := slices.Index(args, "-namespace")
	return ns == "" || i >= 0 && i+1 < len(args) && args[i+1] == ns
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

package testnode

// Flags are the noderun flags that place a node under test: its own
// directories, containerd namespace, network and sockets, so that it meets
// nothing of the host's noderun nor of another node.
type Flags struct {
	Manifests, NodeName                 string
	StateDir, RunDir, LogDir, ImagesDir string
	ContainerdAddress, Namespace        string
	CNIConfDir, PodCIDR, PodBridge      string
	StatusSocket, LogLevel              string
}

// Args are the flags as noderun's command line.
func (f Flags) Args() []string {
	return []string{
		"--log-level", f.LogLevel,
		"--manifests", f.Manifests,
		"--node-name", f.NodeName,
		"--state-dir", f.StateDir,
		"--run-dir", f.RunDir,
		"--pod-log-dir", f.LogDir,
		"--images-dir", f.ImagesDir,
		"--containerd-address", f.ContainerdAddress,
		"--containerd-namespace", f.Namespace,
		"--cni-conf-dir", f.CNIConfDir,
		"--cni-bin-dir", CNIBinDir,
		"--pod-cidr", f.PodCIDR,
		"--pod-bridge", f.PodBridge,
		"--status-socket", f.StatusSocket,
		// Never the port of a noderun running on the host; parallel nodes
		// each get one (`noderun kubeconfig` finds it).
		"--api-port", "0",
	}
}

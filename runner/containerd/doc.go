// Package containerd implements runner.Runtime on containerd's Go client.
// It does two jobs on a client it is given:
//
//   - the Runtime: containers and their tasks (runtime.go), their OCI spec
//     (spec.go, security.go, user.go, rootfs.go), the labels that are the
//     durable record of what runs (labels.go), exits that survive a restart
//     (exits.go), leases (leases.go), exec and attach (exec.go, stream.go)
//     and shims a killed noderun left behind (shims.go);
//   - the images: pulls with registry hosts and credentials (images.go,
//     registry.go), tarballs imported from the images dir (imports.go) and
//     image garbage collection (imagegc.go).
//
// Finding, starting and supervising the containerd daemon itself is the
// business of runner/containerd/daemon.
package containerd

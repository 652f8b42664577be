// Package e2e tests noderun end to end: the real binary against a private
// containerd, runc and the CNI plugins, asserting through the status API,
// containerd and the files on disk. The tests need root; `go test -short`
// skips them.
package e2e

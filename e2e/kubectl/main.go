// Command kubectl is the real kubectl, built from the k8s.io/kubectl module
// at the version go.mod pins, as k8s.io/kubernetes/cmd/kubectl builds it, so
// the e2e tests drive noderun's API with the client users have. It is a
// module of its own: kubectl and client-go never enter noderun's module
// graph or binary (deps_test.go).
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		// Prints the error and exits with its code (a remote command's
		// exit code for exec).
		util.CheckErr(err)
	}
}

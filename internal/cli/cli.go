// Package cli holds noderun's client commands: those that talk to a
// running node over its two APIs, the status socket and the Kubernetes API
// (pods, manifests, describe, events, logs, exec, kubeconfig), and check,
// which reads manifests offline. They find the node through the main
// command's --state-dir, --run-dir and --status-socket; the files there are
// named by kubeapi. The node itself and the host commands stay in main.
package cli

import (
	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/kubeapi"
)

// Commands are the client commands, appended to the main command's.
func Commands() []*cli.Command {
	return []*cli.Command{
		podsCommand(),
		manifestsCommand(),
		checkCommand(),
		kubeconfigCommand(),
		logsCommand(),
		execCommand(),
		attachCommand(),
		describeCommand(),
		eventsCommand(),
	}
}

// statusSocket is the status API's socket: --status-socket, or its place
// under --run-dir.
func statusSocket(c *cli.Context) string {
	if s := c.String("status-socket"); s != "" {
		return s
	}
	return kubeapi.StatusSocket(c.String("run-dir"))
}

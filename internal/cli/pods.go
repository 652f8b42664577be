package cli

import (
	"github.com/urfave/cli/v2"
)

func podsCommand() *cli.Command {
	return &cli.Command{
		Name:        "pods",
		Usage:       "list pods like `kubectl get pods`, from the status API",
		Description: "See docs/operating.md, Status API; docs/kubectl.md for kubectl itself.",
		Action: func(c *cli.Context) error {
			// The API's pod printer, so the columns say what kubectl's do.
			t, err := statusClient(c).table(c.Context, "/pods", nil)
			if err != nil {
				return err
			}
			// kubectl get pods -A, with the IP of its -o wide.
			printTable(c.App.Writer, t, true, "IP")
			return nil
		},
	}
}

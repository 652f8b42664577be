package cli

import (
	"fmt"
	"net/url"

	"github.com/urfave/cli/v2"
)

func eventsCommand() *cli.Command {
	return &cli.Command{
		Name:        "events",
		Usage:       "list events like `kubectl get events`, through the Kubernetes API",
		Description: "See docs/kubectl.md.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Value: "default", Usage: "the events of this namespace"},
			&cli.BoolFlag{Name: "all-namespaces", Aliases: []string{"A"}, Usage: "the events of every namespace"},
			&cli.StringFlag{Name: "for", Usage: "only the events of this pod"},
		},
		Action: func(c *cli.Context) error {
			k, err := apiClient(c, false)
			if err != nil {
				return err
			}
			path := "/api/v1/namespaces/" + url.PathEscape(c.String("namespace")) + "/events"
			if c.Bool("all-namespaces") {
				path = "/api/v1/events"
			}
			q := url.Values{}
			if pod := c.String("for"); pod != "" {
				q.Set("fieldSelector", "involvedObject.kind=Pod,involvedObject.name="+pod)
			}
			t, err := k.table(c.Context, path, q)
			if err != nil {
				return err
			}
			if len(t.Rows) == 0 {
				fmt.Fprintln(c.App.ErrWriter, "No events found.")
				return nil
			}
			printTable(c.App.Writer, t, c.Bool("all-namespaces"))
			return nil
		},
	}
}

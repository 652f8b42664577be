package cli

import (
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/urfave/cli/v2"
)

// podPath is the path of a pod's subresource.
func podPath(namespace, pod, sub string) string {
	return "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(pod) + "/" + sub
}

// podFlags name a pod's container as kubectl's flags do.
func podFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Value: "default", Usage: "the pod's namespace"},
		&cli.StringFlag{Name: "container", Aliases: []string{"c"}, Usage: "the container (needed when the pod has more than one)"},
	}
}

func logsCommand() *cli.Command {
	return &cli.Command{
		Name:                   "logs",
		UseShortOptionHandling: true, // -fp
		Usage:                  "print a container's log, as `kubectl logs` does, through the node's Kubernetes API",
		Description:            "See docs/kubectl.md.",
		ArgsUsage:              "POD",
		Flags: append(podFlags(),
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing until the container ends"},
			&cli.BoolFlag{Name: "previous", Aliases: []string{"p"}, Usage: "the log of the container's previous run"},
			&cli.IntFlag{Name: "tail", Value: -1, Usage: "only the last lines (-1: all)"},
			&cli.DurationFlag{Name: "since", Usage: "only lines newer than this (e.g. 5m)"},
			&cli.BoolFlag{Name: "timestamps", Usage: "begin each line with its time"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("logs: give one pod name (see `noderun pods`)")
			}
			a, err := apiClient(c, false)
			if err != nil {
				return err
			}
			q := url.Values{}
			for _, b := range []string{"follow", "previous", "timestamps"} {
				if c.Bool(b) {
					q.Set(b, "true")
				}
			}
			if ctr := c.String("container"); ctr != "" {
				q.Set("container", ctr)
			}
			if n := c.Int("tail"); n >= 0 {
				q.Set("tailLines", strconv.Itoa(n))
			}
			if d := c.Duration("since"); d > 0 {
				q.Set("sinceSeconds", strconv.Itoa(int(max(d.Seconds(), 1))))
			}
			// No timeout: --follow lasts as long as the container.
			resp, err := a.open(c.Context, podPath(c.String("namespace"), c.Args().First(), "log"), q, "")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if _, err := io.Copy(c.App.Writer, resp.Body); err != nil && c.Context.Err() == nil {
				return err
			}
			return nil
		},
	}
}

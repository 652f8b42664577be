package cli

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/internal/atomicfile"
	"github.com/noderun/noderun/kubeapi"
)

func kubeconfigCommand() *cli.Command {
	return &cli.Command{
		Name:        "kubeconfig",
		Usage:       "print a kubeconfig for kubectl: the view token (read-only), or with --admin the admin token (adds exec, attach, port-forward)",
		Description: "See docs/kubectl.md.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "admin", Usage: "use the admin token"},
			&cli.StringFlag{Name: "server", Usage: "the API's URL (default: where the running noderun serves it)"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "write it to this file (mode 0600) instead of stdout"},
		},
		Action: func(c *cli.Context) error {
			server := c.String("server")
			if server == "" {
				var err error
				var nr *notRunning
				if server, err = serverURL(c); errors.As(err, &nr) {
					return fmt.Errorf("%w; give --server https://HOST:PORT", err)
				} else if err != nil {
					return err
				}
			}
			cfg, err := kubeapi.Kubeconfig(server, kubeapi.CredentialsDir(c.String("state-dir")), c.Bool("admin"))
			if err != nil {
				return err
			}
			if out := c.String("output"); out != "" {
				return atomicfile.WriteFile(out, cfg, 0o600)
			}
			_, err = c.App.Writer.Write(cfg)
			return err
		},
	}
}

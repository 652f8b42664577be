package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

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
				b, err := os.ReadFile(apiServerFile(c))
				if errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("no %s: noderun is not running (or not with this --run-dir); give --server https://HOST:PORT", apiServerFile(c))
				}
				if err != nil {
					return err
				}
				server = string(bytes.TrimSpace(b))
			}
			cfg, err := kubeapi.Kubeconfig(server, apiDir(c), c.Bool("admin"))
			if err != nil {
				return err
			}
			if out := c.String("output"); out != "" {
				return atomicfile.WriteFile(out, cfg, 0o600)
			}
			_, err = os.Stdout.Write(cfg)
			return err
		},
	}
}

package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/noderun/noderun/systemd"
)

func installCommand() *cli.Command {
	return &cli.Command{
		Name:        "install",
		Usage:       "install this binary, its systemd unit and " + systemd.PodsDir + "; enable the unit when systemd runs (idempotent)",
		Description: "Each file is replaced atomically, so it also upgrades a running noderun's binary. See README.md, Install on a real host, and docs/operating.md, Updates.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "root", Value: "/", Usage: "install beneath this directory (an image being built); systemctl is then left to you"},
			&cli.StringFlag{Name: "prefix", Value: "/usr/local", Usage: "the binary goes to <prefix>/bin/noderun"},
			&cli.StringFlag{Name: "unit-dir", Value: "/etc/systemd/system", Usage: "where the unit file goes"},
			&cli.StringFlag{Name: "binary", Usage: "install this file instead of the running binary (another architecture's build)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("install takes no arguments, got %q", c.Args().Slice())
			}
			bin := c.String("binary")
			if bin == "" {
				self, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find the running binary: %w", err)
				}
				bin = self
			}
			root := c.String("root")
			return systemd.Install(systemd.Installation{
				Root: root, Prefix: c.String("prefix"), UnitDir: c.String("unit-dir"), Binary: bin,
				Systemd: filepath.Clean(root) == "/" && systemd.Booted(),
				Out:     os.Stdout,
			})
		},
	}
}

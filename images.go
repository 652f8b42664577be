package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	ctrdrt "github.com/noderun/noderun/runner/containerd"
	"github.com/noderun/noderun/runner/containerd/daemon"
)

func imagesCommand() *cli.Command {
	return &cli.Command{
		Name:        "images",
		Usage:       "manage images",
		Description: "See docs/operating.md, Images and registries.",
		Subcommands: []*cli.Command{{
			Name:        "import",
			Usage:       "import OCI or docker-archive tarballs into noderun's containerd namespace",
			Description: "Connects to the containerd noderun recorded, never starts one. See docs/operating.md, Images and registries.",
			ArgsUsage:   "FILE...",
			Action: func(c *cli.Context) error {
				if c.NArg() == 0 {
					return fmt.Errorf("images import: give at least one tarball")
				}
				log, err := newLogger(c)
				if err != nil {
					return err
				}
				// Never starts a containerd: that is noderun's own choice.
				client, err := daemon.Dial(c.Context, daemonConfig(c, log))
				if err != nil {
					return err
				}
				defer client.Close()
				for _, f := range c.Args().Slice() {
					names, err := ctrdrt.ImportArchive(c.Context, client, f, snapshotter)
					if err != nil {
						return err
					}
					for _, n := range names {
						fmt.Println(n)
					}
				}
				return nil
			},
		}},
	}
}

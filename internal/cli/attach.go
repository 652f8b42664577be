package cli

import (
	"fmt"
	"net/url"
	"os"
	"slices"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"
)

func attachCommand() *cli.Command {
	return &cli.Command{
		Name:                   "attach",
		UseShortOptionHandling: true, // -it
		Usage:                  "show a running container's output from now on and, with -i, pass stdin to its stdin, as `kubectl attach` does, through the node's Kubernetes API (admin token)",
		Description:            "See docs/kubectl.md.",
		ArgsUsage:              "POD",
		Flags: append(podFlags(),
			&cli.BoolFlag{Name: "stdin", Aliases: []string{"i"}, Usage: "pass stdin to the container's (it needs stdin: true)"},
			&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "stdin is a terminal (implied when the container has tty: true)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("attach: give one pod name, after the flags: noderun attach [-i] [-t] [-c CONTAINER] POD")
			}
			a, err := apiClient(c, true)
			if err != nil {
				return err
			}
			ns, name := c.String("namespace"), c.Args().First()
			var pod v1.Pod
			if err := a.get(c.Context, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(name), nil, &pod); err != nil {
				return err
			}
			tty := c.Bool("tty")
			// As kubectl: the container's terminal decides, since a process's
			// terminal cannot change once it runs.
			if ctr := attachedContainer(&pod, c.String("container")); ctr != nil {
				if tty && !ctr.TTY {
					fmt.Fprintf(os.Stderr, "Unable to use a TTY - container %s did not allocate one\n", ctr.Name)
				}
				tty = ctr.TTY
			}
			if tty && c.Bool("stdin") {
				fmt.Fprintln(os.Stderr, "If you don't see a command prompt, try pressing enter.")
			}
			// Without stdin there is no terminal to make raw (kubectl's SetupTTY).
			return runRemote(c, a, podPath(ns, name, "attach"), url.Values{}, c.Bool("stdin"), tty && c.Bool("stdin"))
		},
	}
}

// attachedContainer is the named container, or the pod's only one; nil
// leaves the choice, and its error, to the server.
func attachedContainer(pod *v1.Pod, name string) *v1.Container {
	all := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	if name == "" && len(all) == 1 {
		return &all[0]
	}
	if i := slices.IndexFunc(all, func(c v1.Container) bool { return c.Name == name }); i >= 0 {
		return &all[i]
	}
	return nil
}

package cli

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/kubeapi"
)

// apiClient is what a subcommand needs to reach the node's Kubernetes API
// as kubectl would: its URL, its CA and a token.
type apiClient struct {
	server string
	tls    *tls.Config
	token  string
}

// newAPIClient reads where the running noderun serves the API, its CA and
// the view token, or the admin token.
func newAPIClient(c *cli.Context, admin bool) (*apiClient, error) {
	b, err := os.ReadFile(apiServerFile(c))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no %s: noderun is not running (or not with this --run-dir)", apiServerFile(c))
	} else if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(filepath.Join(apiDir(c), "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("the API's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("the API's CA in %s holds no certificate", apiDir(c))
	}
	tokenFile := kubeapi.ViewTokenFile
	if admin {
		tokenFile = kubeapi.AdminTokenFile
	}
	tok, err := os.ReadFile(filepath.Join(apiDir(c), tokenFile))
	if err != nil {
		return nil, fmt.Errorf("the API's token: %w", err)
	}
	return &apiClient{
		server: string(bytes.TrimSpace(b)),
		tls:    &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		token:  string(bytes.TrimSpace(tok)),
	}, nil
}

// podURL is the URL of a pod's subresource with query q.
func (a *apiClient) podURL(namespace, pod, sub string, q url.Values) string {
	return a.server + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(pod) + "/" + sub + "?" + q.Encode()
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
			a, err := newAPIClient(c, false)
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
			return a.copyLog(c, a.podURL(c.String("namespace"), c.Args().First(), "log", q))
		},
	}
}

func (a *apiClient) copyLog(c *cli.Context, u string) error {
	req, err := http.NewRequestWithContext(c.Context, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: a.tls, Proxy: nil}}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return statusError(resp)
	}
	if _, err := io.Copy(os.Stdout, resp.Body); err != nil && c.Context.Err() == nil {
		return err
	}
	return nil
}

// statusError is the message of the API's Status answer.
func statusError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st metav1.Status
	if json.Unmarshal(b, &st) == nil && st.Message != "" {
		return errors.New(st.Message)
	}
	return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
}

func execCommand() *cli.Command {
	return &cli.Command{
		Name:                   "exec",
		UseShortOptionHandling: true, // -it
		Usage:                  "run a command in a container, as `kubectl exec` does, through the node's Kubernetes API (admin token); exits with the command's code",
		Description:            "See docs/kubectl.md.",
		ArgsUsage:              "POD -- COMMAND [ARG...]",
		Flags: append(podFlags(),
			&cli.BoolFlag{Name: "stdin", Aliases: []string{"i"}, Usage: "pass stdin to the command"},
			&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "give the command a terminal (with -i and a terminal on stdin)"},
		),
		Action: func(c *cli.Context) error {
			args := c.Args().Slice()
			if len(args) > 1 && args[1] == "--" {
				args = append(args[:1], args[2:]...)
			}
			if len(args) < 2 {
				return fmt.Errorf("exec: give a pod name and a command: noderun exec POD -- COMMAND [ARG...]")
			}
			a, err := newAPIClient(c, true)
			if err != nil {
				return err
			}
			tty := c.Bool("tty") && c.Bool("stdin") && term.IsTerminal(int(os.Stdin.Fd()))
			if c.Bool("tty") && !tty {
				fmt.Fprintln(os.Stderr, "Unable to use a TTY - input is not a terminal or the -i flag is not given")
			}
			q := url.Values{"command": args[1:], "stdout": {"true"}}
			s := kubeapi.ExecIO{Stdout: os.Stdout, TTY: tty}
			if c.Bool("stdin") {
				q.Set("stdin", "true")
				s.Stdin = os.Stdin
			}
			if tty {
				q.Set("tty", "true")
				restore, sizes, err := rawTerminal()
				if err != nil {
					return err
				}
				defer restore()
				s.Resize = sizes
			} else {
				q.Set("stderr", "true")
				s.Stderr = os.Stderr
			}
			if ctr := c.String("container"); ctr != "" {
				q.Set("container", ctr)
			}
			err = kubeapi.RemoteCommand(c.Context, a.podURL(c.String("namespace"), args[0], "exec", q), a.tls, a.token, s)
			var exit *kubeapi.ExitError
			if errors.As(err, &exit) {
				return cli.Exit("", exit.Code)
			}
			return err
		},
	}
}

// rawTerminal puts the terminal on stdin in raw mode, as kubectl exec -t
// does, and sends its size now and on each SIGWINCH.
func rawTerminal() (restore func(), sizes <-chan kubeapi.TerminalSize, err error) {
	fd := int(os.Stdin.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, nil, fmt.Errorf("raw terminal: %w", err)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	out := make(chan kubeapi.TerminalSize, 1)
	stop := make(chan struct{})
	go func() {
		defer close(out)
		for {
			if w, h, err := term.GetSize(fd); err == nil {
				select {
				case out <- kubeapi.TerminalSize{Width: uint16(w), Height: uint16(h)}:
				case <-stop:
					return
				}
			}
			select {
			case <-winch:
			case <-stop:
				return
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(stop)
		term.Restore(fd, old)
	}, out, nil
}

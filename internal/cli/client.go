package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/noderun/noderun/kubeapi"
)

// requestTimeout bounds a request and reading its answer; streams (logs
// -f, exec) have none.
const requestTimeout = 30 * time.Second

// client reaches a running node over one of its two APIs: the status
// socket (root-only, no token), or the Kubernetes API over HTTPS with the
// view or the admin token, as `noderun kubeconfig` sets kubectl up.
type client struct {
	name  string // "status API" or "kubernetes API", for errors
	base  string // what every path is joined to
	tls   *tls.Config
	token string // none on the status socket
	hc    *http.Client
}

// statusClient talks to the status API on its unix socket.
func statusClient(c *cli.Context) *client {
	socket := statusSocket(c)
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", socket)
		if err != nil {
			return nil, fmt.Errorf("%w (is noderun running? see --status-socket)", err)
		}
		return conn, nil
	}
	return &client{name: "status API", base: "http://noderun", hc: &http.Client{Transport: &http.Transport{DialContext: dial}}}
}

// apiClient talks to the Kubernetes API: its URL from the run dir, its CA
// and the view token, or with admin the admin token, from the state dir
// (root only).
func apiClient(c *cli.Context, admin bool) (*client, error) {
	server, err := serverURL(c)
	if err != nil {
		return nil, err
	}
	cfg, token, err := kubeapi.ClientCredentials(kubeapi.CredentialsDir(c.String("state-dir")), admin)
	if err != nil {
		return nil, err
	}
	return &client{name: "kubernetes API", base: server, tls: cfg, token: token,
		hc: &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}}, nil
}

// notRunning is the error when the run dir records no API server.
type notRunning struct{ path string }

func (e *notRunning) Error() string {
	return "no " + e.path + ": noderun is not running (or not with this --run-dir)"
}

// serverURL is where the running noderun serves the Kubernetes API.
func serverURL(c *cli.Context) (string, error) {
	path := kubeapi.ServerFile(c.String("run-dir"))
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", &notRunning{path}
	}
	return string(bytes.TrimSpace(b)), err
}

// url is the URL of path with query q.
func (cl *client) url(path string, q url.Values) string {
	if len(q) == 0 {
		return cl.base + path
	}
	return cl.base + path + "?" + q.Encode()
}

// open sends GET path?q, asking for accept ("" is plain JSON), and returns
// the answer when it is 200 OK.
func (cl *client) open(ctx context.Context, path string, q url.Values, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cl.url(path, q), nil)
	if err != nil {
		return nil, err
	}
	if cl.token != "" {
		req.Header.Set("Authorization", "Bearer "+cl.token)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := cl.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cl.name, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, cl.statusError(path, resp)
	}
	return resp, nil
}

// statusError is the message of the Kubernetes API's Status answer, as
// kubectl shows it, or the status line and body of another answer (the
// status socket's are plain text).
func (cl *client) statusError(path string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st metav1.Status
	if json.Unmarshal(b, &st) == nil && st.Message != "" {
		return errors.New(st.Message)
	}
	return fmt.Errorf("%s %s: %s: %s", cl.name, path, resp.Status, bytes.TrimSpace(b))
}

// get fetches path?q as JSON into v.
func (cl *client) get(ctx context.Context, path string, q url.Values, v any) error {
	return cl.decode(ctx, path, q, "", v)
}

// table fetches path?q as a server-side Table.
func (cl *client) table(ctx context.Context, path string, q url.Values) (*metav1.Table, error) {
	var t metav1.Table
	return &t, cl.decode(ctx, path, q, tableAccept, &t)
}

func (cl *client) decode(ctx context.Context, path string, q url.Values, accept string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := cl.open(ctx, path, q, accept)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

package testnode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
)

// StatusClient reaches a node's status API on its unix socket; the embedded
// http.Client takes URLs of any host (the socket is the only one).
type StatusClient struct{ *http.Client }

// NewStatusClient dials socket for every request, each bounded by timeout.
// Without keepAlives a restarted noderun never meets a stale connection.
func NewStatusClient(socket string, timeout time.Duration, keepAlives bool) *StatusClient {
	return &StatusClient{&http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: !keepAlives,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}}
}

// Fetch GETs a status API path and returns the body and when it had all
// arrived; a status other than 200 is an error with the body in it.
func (c *StatusClient) Fetch(ctx context.Context, path string) ([]byte, time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://noderun"+path, nil)
	if err != nil {
		return nil, time.Time{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	at := time.Now()
	if err != nil {
		return nil, at, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, at, fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return b, at, nil
}

// Pods lists the pods the status API reports, and when the answer arrived.
func (c *StatusClient) Pods(ctx context.Context) ([]v1.Pod, time.Time, error) {
	b, at, err := c.Fetch(ctx, "/pods")
	if err != nil {
		return nil, at, err
	}
	var list v1.PodList
	return list.Items, at, json.Unmarshal(b, &list)
}

// PodRunning reports whether the pod is Running with every container
// running.
func PodRunning(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodRunning && len(p.Status.ContainerStatuses) > 0 &&
		!slices.ContainsFunc(p.Status.ContainerStatuses, func(cs v1.ContainerStatus) bool { return cs.State.Running == nil })
}

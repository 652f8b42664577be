package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"
)

func podsCommand() *cli.Command {
	return &cli.Command{
		Name:        "pods",
		Usage:       "list pods like `kubectl get pods`, from the status API",
		Description: "See docs/operating.md, Status API; docs/kubectl.md for kubectl itself.",
		Action: func(c *cli.Context) error {
			var list v1.PodList
			if err := apiGet(c.Context, statusSocket(c), "/pods", &list); err != nil {
				return err
			}
			printPods(os.Stdout, list.Items, time.Now())
			return nil
		},
	}
}

// apiGet fetches path from the status API on its unix socket.
func apiGet(ctx context.Context, socket, path string, v any) error {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://noderun"+path, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("status API at %s: %w (is noderun running? see --status-socket)", socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("status API %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func printPods(w io.Writer, pods []v1.Pod, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tREADY\tSTATUS\tRESTARTS\tAGE\tIP")
	for _, p := range pods {
		ready, restarts := 0, int32(0)
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Ready {
				ready++
			}
			restarts += cs.RestartCount
		}
		age := "<unknown>"
		if p.Status.StartTime != nil {
			age = shortDuration(now.Sub(p.Status.StartTime.Time))
		}
		ip := p.Status.PodIP
		if ip == "" {
			ip = "<none>"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%d\t%s\t%s\n", p.Namespace, p.Name, ready,
			len(p.Spec.Containers), podStatusText(&p), restarts, age, ip)
	}
	tw.Flush()
}

// podStatusText mimics kubectl's STATUS column: a container's waiting or
// terminated reason beats the phase.
func podStatusText(p *v1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "Terminating"
	}
	for i, cs := range p.Status.InitContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode == 0 {
			continue
		}
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" {
			return "Init:" + w.Reason
		}
		return fmt.Sprintf("Init:%d/%d", i, len(p.Spec.InitContainers))
	}
	reason := string(p.Status.Phase)
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			reason = w.Reason
		} else if t := cs.State.Terminated; t != nil && t.Reason != "" {
			reason = t.Reason
		}
	}
	return reason
}

// shortDuration formats like kubectl: 45s, 3m12s, 5h, 12d.
func shortDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 10*time.Minute:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 3*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

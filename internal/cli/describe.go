package cli

import (
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"
)

func describeCommand() *cli.Command {
	return &cli.Command{
		Name:        "describe",
		Usage:       "describe a pod like `kubectl describe pod`, through the Kubernetes API",
		Description: "See docs/kubectl.md.",
		ArgsUsage:   "POD",
		Flags:       []cli.Flag{&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Value: "default", Usage: "the pod's namespace"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("describe: give one pod name (as `noderun pods` shows it)")
			}
			k, err := apiClient(c, false)
			if err != nil {
				return err
			}
			ns, name := c.String("namespace"), c.Args().First()
			var pod v1.Pod
			if err := k.get(c.Context, "/api/v1/namespaces/"+url.PathEscape(ns)+"/pods/"+url.PathEscape(name), nil, &pod); err != nil {
				return err
			}
			var events v1.EventList
			q := url.Values{"fieldSelector": {"involvedObject.name=" + name + ",involvedObject.namespace=" + ns + ",involvedObject.uid=" + string(pod.UID)}}
			if err := k.get(c.Context, "/api/v1/namespaces/"+url.PathEscape(ns)+"/events", q, &events); err != nil {
				return err
			}
			describePod(c.App.Writer, &pod, events.Items, time.Now())
			return nil
		},
	}
}

// describePod prints a pod in the layout of `kubectl describe pod`.
func describePod(w io.Writer, p *v1.Pod, events []v1.Event, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	line := func(indent int, format string, args ...any) {
		fmt.Fprintf(tw, strings.Repeat("  ", indent)+format+"\n", args...)
	}
	orNone := func(s string) string {
		if s == "" {
			return "<none>"
		}
		return s
	}
	kv := func(m map[string]string) string {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, k+"="+m[k])
		}
		return orNone(strings.Join(parts, "\n\t"))
	}
	line(0, "Name:\t%s", p.Name)
	line(0, "Namespace:\t%s", p.Namespace)
	line(0, "Node:\t%s/%s", p.Spec.NodeName, p.Status.HostIP)
	if p.Status.StartTime != nil {
		line(0, "Start Time:\t%s", p.Status.StartTime.Time.Format(time.RFC1123Z))
	}
	line(0, "Labels:\t%s", kv(p.Labels))
	line(0, "Annotations:\t%s", kv(p.Annotations))
	status := string(p.Status.Phase)
	if p.DeletionTimestamp != nil {
		status = "Terminating (lasts " + duration.HumanDuration(now.Sub(p.DeletionTimestamp.Time)) + ")"
	}
	line(0, "Status:\t%s", status)
	if p.Status.Reason != "" {
		line(0, "Reason:\t%s", p.Status.Reason)
	}
	if p.Status.Message != "" {
		line(0, "Message:\t%s", p.Status.Message)
	}
	line(0, "IP:\t%s", p.Status.PodIP)
	if len(p.Status.PodIPs) > 0 {
		line(0, "IPs:\t")
		for _, ip := range p.Status.PodIPs {
			line(1, "IP:\t%s", ip.IP)
		}
	}
	describeContainers(line, "Init Containers", p.Spec.InitContainers, p.Status.InitContainerStatuses)
	describeContainers(line, "Containers", p.Spec.Containers, p.Status.ContainerStatuses)
	if len(p.Status.Conditions) > 0 {
		line(0, "Conditions:")
		line(1, "Type\tStatus")
		for _, c := range p.Status.Conditions {
			line(1, "%s \t%s ", c.Type, c.Status)
		}
	}
	if len(p.Spec.Volumes) > 0 {
		line(0, "Volumes:")
		for _, v := range p.Spec.Volumes {
			line(1, "%s:", v.Name)
			line(2, "Type:\t%s", volumeType(&v))
		}
	} else {
		line(0, "Volumes:\t<none>")
	}
	line(0, "QoS Class:\t%s", p.Status.QOSClass)
	tw.Flush()
	describeEvents(w, events, now)
}

func describeContainers(line func(int, string, ...any), title string, specs []v1.Container, statuses []v1.ContainerStatus) {
	if len(specs) == 0 {
		return
	}
	line(0, "%s:", title)
	for _, c := range specs {
		var st v1.ContainerStatus
		found := false
		for _, s := range statuses {
			if s.Name == c.Name {
				st, found = s, true
			}
		}
		line(1, "%s:", c.Name)
		line(2, "Container ID:\t%s", st.ContainerID)
		line(2, "Image:\t%s", c.Image)
		line(2, "Image ID:\t%s", st.ImageID)
		var ports []string
		for _, p := range c.Ports {
			ports = append(ports, fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol))
		}
		if len(ports) == 0 {
			ports = []string{"<none>"}
		}
		line(2, "Port:\t%s", strings.Join(ports, ", "))
		if len(c.Command) > 0 {
			line(2, "Command:")
			for _, a := range c.Command {
				line(3, "%s", a)
			}
		}
		// As kubectl: a container with no status (its pod was rejected
		// at admission) has no state to show.
		if found {
			describeState(line, "State", st.State)
			if st.LastTerminationState.Terminated != nil {
				describeState(line, "Last State", st.LastTerminationState)
			}
			line(2, "Ready:\t%v", st.Ready)
			line(2, "Restart Count:\t%d", st.RestartCount)
		}
		for _, pr := range []struct {
			name  string
			probe *v1.Probe
		}{{"Liveness", c.LivenessProbe}, {"Readiness", c.ReadinessProbe}, {"Startup", c.StartupProbe}} {
			if pr.probe != nil {
				line(2, "%s:\tdelay=%ds timeout=%ds period=%ds #success=%d #failure=%d", pr.name, pr.probe.InitialDelaySeconds,
					pr.probe.TimeoutSeconds, pr.probe.PeriodSeconds, pr.probe.SuccessThreshold, pr.probe.FailureThreshold)
			}
		}
		line(2, "Environment:\t%s", map[bool]string{true: "<none>", false: ""}[len(c.Env) == 0])
		for _, e := range c.Env {
			v := e.Value
			if e.ValueFrom != nil {
				v = "(from a reference)"
			}
			line(3, "%s:\t%s", e.Name, v)
		}
	}
}

func describeState(line func(int, string, ...any), title string, s v1.ContainerState) {
	switch {
	case s.Running != nil:
		line(2, "%s:\tRunning", title)
		line(3, "Started:\t%s", s.Running.StartedAt.Time.Format(time.RFC1123Z))
	case s.Waiting != nil:
		line(2, "%s:\tWaiting", title)
		line(3, "Reason:\t%s", s.Waiting.Reason)
	case s.Terminated != nil:
		line(2, "%s:\tTerminated", title)
		line(3, "Reason:\t%s", s.Terminated.Reason)
		line(3, "Exit Code:\t%d", s.Terminated.ExitCode)
		line(3, "Started:\t%s", s.Terminated.StartedAt.Time.Format(time.RFC1123Z))
		line(3, "Finished:\t%s", s.Terminated.FinishedAt.Time.Format(time.RFC1123Z))
	default:
		line(2, "%s:\tWaiting", title)
	}
}

func volumeType(v *v1.Volume) string {
	switch {
	case v.HostPath != nil:
		return "HostPath (bare host directory volume) " + v.HostPath.Path
	case v.EmptyDir != nil:
		return "EmptyDir (a temporary directory that shares a pod's lifetime)"
	case v.ConfigMap != nil:
		return "ConfigMap " + v.ConfigMap.Name
	case v.Secret != nil:
		return "Secret " + v.Secret.SecretName
	case v.DownwardAPI != nil:
		return "DownwardAPI (a volume populated by information about the pod)"
	case v.Projected != nil:
		return "Projected (a volume that contains injected data from multiple sources)"
	}
	return "<unknown>"
}

// describeEvents prints the events table of kubectl describe.
func describeEvents(w io.Writer, events []v1.Event, now time.Time) {
	if len(events) == 0 {
		fmt.Fprintln(w, "Events:                      <none>")
		return
	}
	slices.SortStableFunc(events, func(a, b v1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	fmt.Fprintln(w, "Events:")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  Type\tReason\tAge\tFrom\tMessage")
	fmt.Fprintln(tw, "  ----\t------\t----\t----\t-------")
	for _, e := range events {
		age := duration.HumanDuration(now.Sub(e.FirstTimestamp.Time))
		if e.Count > 1 {
			age = fmt.Sprintf("%s (x%d over %s)", duration.HumanDuration(now.Sub(e.LastTimestamp.Time)), e.Count,
				duration.HumanDuration(now.Sub(e.FirstTimestamp.Time)))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Type, e.Reason, age, e.Source.Component, strings.TrimSpace(e.Message))
	}
	tw.Flush()
}

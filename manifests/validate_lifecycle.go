package manifests

import (
	"fmt"
	"path"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// lifecycle validates a container's restartPolicy, probes and hooks with
// Kubernetes' rules: init containers take probes and hooks only as sidecars
// (restartPolicy Always); liveness and startup need successThreshold 1.
func (v *validator) lifecycle(c *v1.Container, field string, init bool, grace int64) {
	sidecar := init && c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
	v.restartRules(c, field)
	probes := []struct {
		name string
		p    *v1.Probe
	}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}, {"startupProbe", c.StartupProbe}}
	for _, pr := range probes {
		if pr.p == nil {
			continue
		}
		f := field + "." + pr.name
		if init && !sidecar {
			v.add(f, "may not be set for init containers without restartPolicy=Always")
			continue
		}
		v.probe(pr.p, f, pr.name != "readinessProbe")
	}
	if c.Lifecycle != nil {
		if init && !sidecar {
			v.add(field+".lifecycle", "may not be set for init containers without restartPolicy=Always")
		} else {
			v.hook(c.Lifecycle.PostStart, field+".lifecycle.postStart", grace)
			v.hook(c.Lifecycle.PreStop, field+".lifecycle.preStop", grace)
		}
	}
	if p := c.TerminationMessagePath; p != "" && !path.IsAbs(p) {
		v.add(field+".terminationMessagePath", "must be an absolute path")
	}
}

// restartRules is the API server's validateContainerRestartPolicy with
// v1.37's default gates (ContainerRestartRules and
// RestartAllContainersOnContainerExits on): any container may set
// restartPolicy (on an init container Always makes a sidecar), rules need
// a restartPolicy, at most 20 rules of 255 exit codes each.
func (v *validator) restartRules(c *v1.Container, field string) {
	if c.RestartPolicy == nil {
		if len(c.RestartPolicyRules) > 0 {
			v.add(field+".restartPolicy", "must specify restartPolicy when restart rules are used")
		}
		return
	}
	v.enum(field+".restartPolicy", string(*c.RestartPolicy), "Always", "Never", "OnFailure")
	if n := len(c.RestartPolicyRules); n > maxRestartRules {
		v.add(field+".restartPolicyRules", "must have at most %d items", maxRestartRules)
	}
	for i, r := range c.RestartPolicyRules {
		f := fmt.Sprintf("%s.restartPolicyRules[%d]", field, i)
		v.enum(f+".action", string(r.Action), "Restart", "RestartAllContainers")
		if r.ExitCodes == nil {
			v.add(f+".exitCodes", "required")
			continue
		}
		v.enum(f+".exitCodes.operator", string(r.ExitCodes.Operator), "In", "NotIn")
		if n := len(r.ExitCodes.Values); n > maxRuleExitCodes {
			v.add(f+".exitCodes.values", "must have at most %d items", maxRuleExitCodes)
		}
	}
}

// The API server's limits on restartPolicyRules.
const (
	maxRestartRules  = 20
	maxRuleExitCodes = 255
)

func (v *validator) probe(p *v1.Probe, field string, mustSucceedOnce bool) {
	h := p.ProbeHandler
	n := count(h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil)
	switch {
	case n == 0:
		v.add(field, "must specify a handler type")
	case n > 1:
		v.add(field, "may not specify more than 1 handler type")
	}
	v.exec(h.Exec, field+".exec")
	v.httpGet(h.HTTPGet, field+".httpGet")
	if h.TCPSocket != nil {
		v.portNumOrName(h.TCPSocket.Port, field+".tcpSocket.port")
	}
	if h.GRPC != nil {
		v.check(field+".grpc.port", validation.IsValidPortNum(int(h.GRPC.Port)))
	}
	for name, n := range map[string]int32{"initialDelaySeconds": p.InitialDelaySeconds, "timeoutSeconds": p.TimeoutSeconds,
		"periodSeconds": p.PeriodSeconds, "successThreshold": p.SuccessThreshold, "failureThreshold": p.FailureThreshold} {
		if n < 0 {
			v.add(field+"."+name, "must be greater than or equal to 0")
		}
	}
	if mustSucceedOnce && p.SuccessThreshold > 1 {
		v.add(field+".successThreshold", "must be 1")
	}
	if g := p.TerminationGracePeriodSeconds; g != nil {
		switch {
		case !mustSucceedOnce:
			v.add(field+".terminationGracePeriodSeconds", "must not be set for readinessProbes")
		case *g <= 0:
			v.add(field+".terminationGracePeriodSeconds", "must be greater than 0")
		}
	}
}

func (v *validator) hook(h *v1.LifecycleHandler, field string, grace int64) {
	if h == nil {
		return
	}
	// tcpSocket is refused by the field lists already.
	switch count(h.Exec != nil, h.HTTPGet != nil, h.Sleep != nil, h.TCPSocket != nil) {
	case 0:
		v.add(field, "must specify a handler type")
	case 1:
	default:
		v.add(field, "may not specify more than 1 handler type")
	}
	v.exec(h.Exec, field+".exec")
	v.httpGet(h.HTTPGet, field+".httpGet")
	if h.Sleep != nil && (h.Sleep.Seconds < 0 || h.Sleep.Seconds > grace) {
		v.add(field+".sleep.seconds", "must be non-negative and less than terminationGracePeriodSeconds (%d)", grace)
	}
}

func (v *validator) exec(e *v1.ExecAction, field string) {
	if e != nil && len(e.Command) == 0 {
		v.add(field+".command", "required")
	}
}

func (v *validator) httpGet(h *v1.HTTPGetAction, field string) {
	if h == nil {
		return
	}
	v.portNumOrName(h.Port, field+".port")
	v.oneOf(field+".scheme", string(h.Scheme), "HTTP", "HTTPS")
	for i, hdr := range h.HTTPHeaders {
		v.check(fmt.Sprintf("%s.httpHeaders[%d].name", field, i), validation.IsHTTPHeaderName(hdr.Name))
	}
}

func (v *validator) portNumOrName(p intstr.IntOrString, field string) {
	if p.Type == intstr.String {
		v.check(field, validation.IsValidPortName(p.StrVal))
		return
	}
	v.check(field, validation.IsValidPortNum(p.IntValue()))
}

func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

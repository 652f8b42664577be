package cni

import (
	"fmt"
	"math"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Bandwidth limits a pod's traffic: rates in bits per second, bursts in
// bits. The JSON names are the CNI bandwidth capability's; a zero rate
// leaves that direction unlimited.
type Bandwidth struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// The kubelet's bounds for bandwidth annotations
// (pkg/util/bandwidth.validateBandwidthIsReasonable).
var (
	minBandwidth = resource.MustParse("1k")
	maxBandwidth = resource.MustParse("1P")
)

// defaultBurst is the burst the kubelet passed to the bandwidth plugin for
// every limit (math.MaxInt32 bits, i.e. 256 MiB): pods have no annotation
// for it, and the plugin requires a burst with every rate.
const defaultBurst = math.MaxInt32

// ParseBandwidth turns the values of a pod's kubernetes.io/ingress-bandwidth
// and kubernetes.io/egress-bandwidth annotations (quantities in bits per
// second such as "10M" or "1Gi"; "" for no annotation) into limits, as the
// kubelet does. It returns nil if both are empty.
func ParseBandwidth(ingress, egress string) (*Bandwidth, error) {
	if ingress == "" && egress == "" {
		return nil, nil
	}
	var bw Bandwidth
	var err error
	if bw.IngressRate, err = parseRate(ingress); err != nil {
		return nil, fmt.Errorf("cni: ingress bandwidth: %w", err)
	}
	if bw.EgressRate, err = parseRate(egress); err != nil {
		return nil, fmt.Errorf("cni: egress bandwidth: %w", err)
	}
	if bw.IngressRate > 0 {
		bw.IngressBurst = defaultBurst
	}
	if bw.EgressRate > 0 {
		bw.EgressBurst = defaultBurst
	}
	return &bw, nil
}

// parseRate parses one annotation value; "" is 0, no limit.
func parseRate(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}
	// Value rounds up to a whole bit per second, as in the kubelet's check.
	v := q.Value()
	switch {
	case v < minBandwidth.Value():
		return 0, fmt.Errorf("%q is unreasonably small (< 1kbit)", s)
	case v > maxBandwidth.Value():
		return 0, fmt.Errorf("%q is unreasonably large (> 1Pbit)", s)
	}
	return uint64(v), nil
}

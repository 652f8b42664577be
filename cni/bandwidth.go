package cni

import (
	"fmt"
	"math"

	"github.com/noderun/noderun/internal/bandwidth"
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
	if bw.IngressRate, err = bandwidth.ParseRate(ingress); err != nil {
		return nil, fmt.Errorf("cni: ingress bandwidth: %w", err)
	}
	if bw.EgressRate, err = bandwidth.ParseRate(egress); err != nil {
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

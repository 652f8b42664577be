// Package bandwidth reads the kubernetes.io/ingress-bandwidth and
// egress-bandwidth pod annotations as the kubelet does, so that `noderun
// check` refuses a bad value as the CNI attachment later would.
package bandwidth

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The annotations.
const (
	IngressAnnotation = "kubernetes.io/ingress-bandwidth"
	EgressAnnotation  = "kubernetes.io/egress-bandwidth"
)

// The kubelet's bounds (pkg/util/bandwidth.validateBandwidthIsReasonable).
var (
	minRate = resource.MustParse("1k")
	maxRate = resource.MustParse("1P")
)

// ParseRate parses one annotation value into bits per second; "" is 0, no
// limit.
func ParseRate(s string) (uint64, error) {
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
	case v < minRate.Value():
		return 0, fmt.Errorf("%q is unreasonably small (< 1kbit)", s)
	case v > maxRate.Value():
		return 0, fmt.Errorf("%q is unreasonably large (> 1Pbit)", s)
	}
	return uint64(v), nil
}

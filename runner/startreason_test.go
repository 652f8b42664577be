package runner

import (
	"errors"
	"fmt"
	"testing"
)

func TestStartReason(t *testing.T) {
	cfgErr := fmt.Errorf("%w: spec.containers[0].securityContext.seccompProfile.localhostProfile: missing", ErrContainerConfig)
	for err, want := range map[error]string{
		fmt.Errorf("container c1: %w", cfgErr):   "CreateContainerConfigError",
		errors.New("start task c1: runc failed"): "RunContainerError",
	} {
		if got := startReason(err); got != want {
			t.Errorf("startReason(%v) = %s, want %s", err, got, want)
		}
	}
}

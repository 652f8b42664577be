package manifests

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
)

// RollbackAfterAnnotation opts a pod into rollback: a new version of it
// (a manifest edit: a new UID) that is not Ready within this Go duration of
// its start is replaced by the last version of the pod that was Ready.
const RollbackAfterAnnotation = AnnotationPrefix + "rollback-after"

// rollbackAfterField is the field path of the annotation in errors.
const rollbackAfterField = "metadata.annotations[" + RollbackAfterAnnotation + "]"

// Bounds of the rollback deadline: below a second a pod cannot become
// Ready (the kubelet probes every second at most); above a week is not a
// deadline an unattended box waits out.
const (
	minRollbackAfter = time.Second
	maxRollbackAfter = 7 * 24 * time.Hour
)

// ParseRollbackAfter parses the annotation's value: a Go duration ("90s",
// "5m") within the bounds.
func ParseRollbackAfter(value string) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 90s or 5m", value)
	}
	if d < minRollbackAfter || d > maxRollbackAfter {
		return 0, fmt.Errorf("%s is not between %s and %s", value, minRollbackAfter, maxRollbackAfter)
	}
	return d, nil
}

// RollbackAfter returns a validated pod's rollback deadline, ok false when
// it has none.
func RollbackAfter(pod *v1.Pod) (d time.Duration, ok bool) {
	value, set := pod.Annotations[RollbackAfterAnnotation]
	if !set {
		return 0, false
	}
	d, err := ParseRollbackAfter(value)
	return d, err == nil
}

// rollbackAfter validates the annotation. Rollback judges a version by its
// Ready condition, which a pod meant to end loses when it ends: so only
// restartPolicy Always (the default) may ask for it.
func (v *validator) rollbackAfter(pod *v1.Pod) {
	value, ok := pod.Annotations[RollbackAfterAnnotation]
	if !ok {
		return
	}
	if _, err := ParseRollbackAfter(value); err != nil {
		v.add(rollbackAfterField, "%v", err)
	}
	if p := pod.Spec.RestartPolicy; p != "" && p != v1.RestartPolicyAlways {
		v.add(rollbackAfterField, "needs restartPolicy Always, not %s: a version is judged by its Ready condition, which a pod that ends loses", p)
	}
}

package containerd

// Every label noderun puts on a containerd container. They are the durable
// record of what runs, so a restarted noderun can adopt its pods.
const (
	labelPrefix       = "io.noderun."
	LabelPodUID       = labelPrefix + "pod.uid"
	LabelPodName      = labelPrefix + "pod.name"
	LabelPodNamespace = labelPrefix + "pod.namespace"
	LabelContainer    = labelPrefix + "container.name"
	LabelInit         = labelPrefix + "container.init"
	LabelSpecHash     = labelPrefix + "container.spec-hash"
	LabelRestartCount = labelPrefix + "container.restart-count"
	LabelImageRef     = labelPrefix + "container.image"
	LabelStopSignal   = labelPrefix + "container.stop-signal"
	LabelLogPath      = labelPrefix + "container.log-path"
	LabelImageID      = labelPrefix + "container.image-id"
	// The process's resolved uid:gid:groups, reported as status user.linux.
	LabelUser = labelPrefix + "container.user"
	// "true" once containerd reported an OOM kill in the container's
	// cgroup; set after creation, from the event stream.
	LabelOOMKilled = labelPrefix + "container.oom-killed"
	// "<boot-id> <pid> <pid start ticks> <time>", written once the task
	// started: a run whose task is gone ran, and may still run if that
	// process does (exits.go).
	LabelStarted = labelPrefix + "run.started"
	// "<exit code> <time> [reason]", written when the run's end is seen,
	// so it outlives the task (a reboot, a lost shim).
	LabelExit = labelPrefix + "run.exit"
	// The epoch of the pod sandbox the container was started in.
	LabelSandboxEpoch = labelPrefix + "pod.sandbox-epoch"
	// The previous run's termination, so lastState survives the container
	// being replaced on restart.
	LabelLastExitCode = labelPrefix + "last.exit-code"
	LabelLastReason   = labelPrefix + "last.reason"
	LabelLastStarted  = labelPrefix + "last.started-at"
	LabelLastFinished = labelPrefix + "last.finished-at"
	LabelLastID       = labelPrefix + "last.container-id"
)

// ownedFilter selects the containers noderun manages.
const ownedFilter = `labels."` + LabelPodUID + `"`

package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/typeurl/v2"
	"github.com/noderun/noderun/internal/testnode"
)

// The two containerd events the bench times: a container's process runs,
// and a container is gone (after its task, which must go first).
const (
	topicStart  = "/tasks/start"
	topicDelete = "/containers/delete"
)

// pollEvery is how often the bench looks at what events cannot tell: the
// pinned namespaces' mounts. Short, so it adds little to what it times.
const pollEvery = 5 * time.Millisecond

type event struct {
	topic, id string
	at        time.Time // when the bench received it
}

// watcher sees one namespace through containerd's event stream, the same
// way for noderun and the floor, so both are timed alike.
type watcher struct {
	ns     string
	events chan event
	failed chan error
}

func newWatcher(ctx context.Context, client *containerd.Client, ns string) *watcher {
	envs, errs := client.Subscribe(ctx,
		fmt.Sprintf(`topic==%q,namespace==%q`, topicStart, ns),
		fmt.Sprintf(`topic==%q,namespace==%q`, topicDelete, ns))
	// Large enough for every event of a 100-pod burst and its teardown
	// between two drains.
	w := &watcher{ns: ns, events: make(chan event, 4096), failed: make(chan error, 1)}
	go func() {
		for {
			select {
			case env := <-envs:
				at := time.Now()
				ev, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				var id string
				switch e := ev.(type) {
				case *apievents.TaskStart:
					id = e.ContainerID
				case *apievents.ContainerDelete:
					id = e.ID
				}
				select {
				case w.events <- event{env.Topic, id, at}:
				case <-ctx.Done():
					return
				}
			case err := <-errs:
				if err == nil {
					err = errors.New("event stream closed")
				}
				w.failed <- err
				return
			}
		}
	}()
	return w
}

// drain drops what arrived before a measurement begins.
func (w *watcher) drain() {
	for {
		select {
		case <-w.events:
		default:
			return
		}
	}
}

// waitN returns when the n-th distinct container had a topic event.
func (w *watcher) waitN(ctx context.Context, topic string, n int, timeout time.Duration) (time.Time, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	seen := map[string]bool{}
	for {
		select {
		case ev := <-w.events:
			if ev.topic != topic || seen[ev.id] {
				continue
			}
			seen[ev.id] = true
			if len(seen) == n {
				return ev.at, nil
			}
		case err := <-w.failed:
			return time.Time{}, fmt.Errorf("containerd events (%s): %w", w.ns, err)
		case <-timer.C:
			return time.Time{}, fmt.Errorf("%s: %d of %d %s events after %s", w.ns, len(seen), n, topic, timeout)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// waitNoNetNS returns when no namespace is pinned under podsDir any more.
func waitNoNetNS(ctx context.Context, podsDir string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		ms, err := testnode.MountsUnder(podsDir)
		if err != nil {
			return time.Time{}, err
		}
		// podsDir itself may be a tmpfs (env.runState).
		pins := slices.DeleteFunc(ms, func(m testnode.Mount) bool { return m.FSType != "nsfs" })
		now := time.Now()
		if len(pins) == 0 {
			return now, nil
		}
		if now.After(deadline) {
			return time.Time{}, fmt.Errorf("%d namespaces still pinned under %s after %s", len(pins), podsDir, timeout)
		}
		select {
		case <-time.After(pollEvery):
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// checkEmpty verifies that a namespace holds no container and no task.
func checkEmpty(ctx context.Context, client *containerd.Client, ns string) error {
	ctx = namespaces.WithNamespace(ctx, ns)
	cs, err := client.ContainerService().List(ctx)
	if err != nil {
		return err
	}
	ts, err := client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return err
	}
	if len(cs)+len(ts.Tasks) > 0 {
		return fmt.Errorf("%s: %d containers and %d tasks left", ns, len(cs), len(ts.Tasks))
	}
	return nil
}

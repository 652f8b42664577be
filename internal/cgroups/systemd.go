package cgroups

import (
	"context"
	"errors"
	"fmt"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// stopSystemdUnit stops a unit through systemd's D-Bus API and waits for
// the job; a unit systemd does not know is stopped already.
func stopSystemdUnit(ctx context.Context, name string) error {
	conn, err := sddbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	done := make(chan string, 1)
	if _, err := conn.StopUnitContext(ctx, name, "replace", done); err != nil {
		var derr dbus.Error
		if errors.As(err, &derr) && derr.Name == "org.freedesktop.systemd1.NoSuchUnit" {
			return nil
		}
		return err
	}
	return waitJob(ctx, done)
}

// setSystemdSlice starts a transient slice with props and waits for the
// job; a slice that runs already gets them set instead, for as long as it
// runs (runtime), as the kubelet updates its QoS slices.
func setSystemdSlice(ctx context.Context, name string, props []sddbus.Property) error {
	conn, err := sddbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	done := make(chan string, 1)
	start := append([]sddbus.Property{sddbus.PropDescription("noderun " + name),
		{Name: "DefaultDependencies", Value: dbus.MakeVariant(false)}}, props...)
	if _, err := conn.StartTransientUnitContext(ctx, name, "replace", start, done); err != nil {
		var derr dbus.Error
		if errors.As(err, &derr) && derr.Name == "org.freedesktop.systemd1.UnitExists" {
			return conn.SetUnitPropertiesContext(ctx, name, true, props...)
		}
		return err
	}
	return waitJob(ctx, done)
}

// waitJob waits for a systemd job's result.
func waitJob(ctx context.Context, done <-chan string) error {
	select {
	case res := <-done:
		if res != "done" {
			return fmt.Errorf("systemd job %s", res)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

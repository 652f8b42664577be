package prober

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	v1 "k8s.io/api/core/v1"

	"github.com/noderun/noderun/internal/testenv"
)

// slowHealth answers Check only when the call's context ends.
type slowHealth struct {
	healthpb.UnimplementedHealthServer
}

func (slowHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// grpcServer serves a health service (hs, or none when nil) and records
// the user agent of each call.
func grpcServer(t *testing.T, hs healthpb.HealthServer) (port int, userAgent func() string) {
	t.Helper()
	l, port := listen(t, "127.0.0.1:0")
	var mu sync.Mutex
	var ua string
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		ua = strings.Join(md.Get("user-agent"), ",")
		mu.Unlock()
		return next(ctx, req)
	}))
	if hs != nil {
		healthpb.RegisterHealthServer(srv, hs)
	}
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return port, func() string { mu.Lock(); defer mu.Unlock(); return ua }
}

func TestGRPCProbe(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus("cache", healthpb.HealthCheckResponse_SERVICE_UNKNOWN)
	healthy, userAgent := grpcServer(t, hs)
	bare, _ := grpcServer(t, nil)
	slow, _ := grpcServer(t, slowHealth{})
	closed := closedPort(t)
	timeout := 300 * time.Millisecond
	if testenv.Emulated() { // a handshake under qemu-user takes longer
		timeout = 3 * time.Second
	}
	for _, tc := range []struct {
		name    string
		port    int
		service string
		want    Result
		wantMsg string
	}{
		{"serving", healthy, "", Success, "service healthy"},
		{"not serving", healthy, "db", Failure, `service unhealthy (responded with "NOT_SERVING")`},
		{"service unknown", healthy, "cache", Failure, `service unhealthy (responded with "SERVICE_UNKNOWN")`},
		{"service not registered", healthy, "other", Failure, "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"},
		{"no health service", bare, "", Failure,
			"error: this server does not implement the grpc health protocol (grpc.health.v1.Health): unknown service grpc.health.v1.Health"},
		{"check times out", slow, "", Failure, fmt.Sprintf("timeout: health rpc did not complete within %s", timeout)},
		// The kubelet dials blocking: a port nobody listens on is a
		// connect timeout.
		{"nothing listens", closed, "", Failure,
			fmt.Sprintf(`timeout: failed to connect service "127.0.0.1:%d" within %s: context deadline exceeded`, closed, timeout)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &v1.ProbeHandler{GRPC: &v1.GRPCAction{Port: int32(tc.port)}}
			if tc.service != "" {
				h.GRPC.Service = &tc.service
			}
			start := time.Now()
			res, msg, err := Do(context.Background(), h, timeout, Target{PodIP: "127.0.0.1"}, nil)
			if res != tc.want || msg != tc.wantMsg || err != nil {
				t.Errorf("got %v %q %v, want %v %q", res, msg, err, tc.want, tc.wantMsg)
			}
			// Bounded by the timeout (slowHealth never answers); generous
			// for a busy machine.
			if took := time.Since(start); took > timeout+10*time.Second {
				t.Errorf("took %s with a %s timeout", took, timeout)
			}
		})
	}
	if ua := userAgent(); !strings.HasPrefix(ua, "kube-probe/1.37 grpc-go/") {
		t.Errorf("user agent %q, want kube-probe/1.37 (grpc-go appends its own)", ua)
	}
}

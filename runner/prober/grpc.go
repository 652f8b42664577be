package prober

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
)

// doGRPC is the kubelet's grpc prober: gRPC's health Check on the pod's IP
// without TLS; SERVING succeeds, anything else fails with the kubelet's
// message.
func doGRPC(ctx context.Context, h *v1.GRPCAction, timeout time.Duration, t Target) (Result, string, error) {
	addr := net.JoinHostPort(t.PodIP, strconv.Itoa(int(h.Port)))
	// DialContext with WithBlock (deprecated in favour of NewClient, which
	// connects lazily) is what the kubelet calls: a server that cannot be
	// reached is a connect timeout, not a failed RPC.
	conn, err := grpc.DialContext(ctx, addr,
		grpc.WithUserAgent("kube-probe/"+version),
		grpc.WithBlock(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return probeDialer.DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return Failure, fmt.Sprintf("timeout: failed to connect service %q within %v: %+v", addr, timeout, err), nil
		}
		return Failure, fmt.Sprintf("error: failed to connect service at %q: %+v", addr, err), nil
	}
	defer conn.Close()
	service := ""
	if h.Service != nil {
		service = *h.Service
	}
	resp, err := healthpb.NewHealthClient(conn).Check(metadata.NewOutgoingContext(ctx, metadata.MD{}),
		&healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		if st, ok := status.FromError(err); ok {
			switch st.Code() {
			case codes.Unimplemented:
				return Failure, fmt.Sprintf("error: this server does not implement the grpc health protocol (grpc.health.v1.Health): %s", st.Message()), nil
			case codes.DeadlineExceeded:
				return Failure, fmt.Sprintf("timeout: health rpc did not complete within %v", timeout), nil
			}
		}
		return Failure, fmt.Sprintf("error: health rpc probe failed: %+v", err), nil
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return Failure, fmt.Sprintf("service unhealthy (responded with %q)", resp.GetStatus().String()), nil
	}
	return Success, "service healthy", nil
}

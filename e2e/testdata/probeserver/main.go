// Command probeserver is a probe target for noderun's end-to-end tests: a
// gRPC health server (and an HTTP /healthz) that is healthy while a file
// exists, or until a given time after its start.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

type health struct {
	healthpb.UnimplementedHealthServer
	healthy func() bool
}

func (h health) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.healthy() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

func main() {
	grpcAddr := flag.String("grpc", ":9090", "gRPC health address")
	httpAddr := flag.String("http", "", "HTTP /healthz address (none if empty)")
	file := flag.String("healthy-file", "", "healthy while this file exists")
	after := flag.Duration("unhealthy-after", 0, "unhealthy from this long after start (0: never)")
	flag.Parse()
	start := time.Now()
	healthy := func() bool {
		if *after > 0 && time.Since(start) >= *after {
			return false
		}
		if *file != "" {
			_, err := os.Stat(*file)
			return err == nil
		}
		return true
	}
	if *httpAddr != "" {
		go func() {
			log.Fatal(http.ListenAndServe(*httpAddr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if !healthy() {
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			})))
		}()
	}
	l, err := net.Listen("tcp", *grpcAddr)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health{healthy: healthy})
	log.Printf("serving gRPC health on %s", l.Addr())
	log.Fatal(srv.Serve(l))
}

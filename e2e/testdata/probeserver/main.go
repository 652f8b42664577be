// Command probeserver is a probe target for noderun's end-to-end tests: a
// gRPC health server, an HTTP /healthz and a raw TCP listener, healthy while
// a file exists, or until a given time after its start. Each change of
// health is printed to stdout ("healthy", "unhealthy"), so the container's
// log dates it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// checkEvery is how often the health file is looked at: well below the
// 1 s probe periods of the tests.
const checkEvery = 50 * time.Millisecond

type health struct {
	healthpb.UnimplementedHealthServer
	ok *atomic.Bool
}

func (h health) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.ok.Load() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

func main() {
	grpcAddr := flag.String("grpc", ":9090", "gRPC health address (none if empty)")
	httpAddr := flag.String("http", "", "HTTP /healthz address (none if empty)")
	tcpAddr := flag.String("tcp", "", "TCP address listened on only while healthy (none if empty)")
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
	var ok atomic.Bool
	if *httpAddr != "" {
		go func() {
			log.Fatal(http.ListenAndServe(*httpAddr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if !ok.Load() {
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			})))
		}()
	}
	if *grpcAddr != "" {
		l, err := net.Listen("tcp", *grpcAddr)
		if err != nil {
			log.Fatal(err)
		}
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, health{ok: &ok})
		go func() { log.Fatal(srv.Serve(l)) }()
	}
	watch(healthy, &ok, *tcpAddr)
}

// watch keeps ok (and the TCP listener) in step with healthy and prints
// every change.
func watch(healthy func() bool, ok *atomic.Bool, tcpAddr string) {
	var tcp net.Listener
	first := true
	for ; ; time.Sleep(checkEvery) {
		now := healthy()
		if !first && now == ok.Load() {
			continue
		}
		first = false
		ok.Store(now)
		if tcpAddr != "" {
			tcp = setTCP(tcp, tcpAddr, now)
		}
		if now {
			fmt.Println("healthy")
		} else {
			fmt.Println("unhealthy")
		}
	}
}

// setTCP opens the listener (accepting and closing connections) or closes
// it, so a tcpSocket probe is refused while unhealthy.
func setTCP(l net.Listener, addr string, open bool) net.Listener {
	if !open {
		if l != nil {
			l.Close()
		}
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l
}

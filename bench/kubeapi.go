package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/noderun/noderun/internal/testnode"
	v1 "k8s.io/api/core/v1"
)

// kubeWatches is how many watches stay open while the idle CPU is measured
// again: kubectl get -w, a dashboard, a Prometheus... each holds one.
const kubeWatches = 10

const tableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"

// kubeMeasures are the Kubernetes API's costs at the largest burst.
type kubeMeasures struct {
	pods          int
	tableGetMS    []float64 // GET /api/v1/pods as Table, as kubectl get pods asks
	summaryMS     []float64 // GET /stats/summary, a fresh collection (kubectl top reads the same)
	summaryCPUMS  []float64 // noderun's CPU time for it
	watchCPU      float64   // noderun's CPU with kubeWatches watches open, idle
	watchHostBusy float64
}

// kubeClient reaches the node's HTTPS API with its CA and view token.
func (n *node) kubeClient() (*http.Client, string, string, error) {
	server, err := os.ReadFile(filepath.Join(n.dir, "run", "api-server"))
	if err != nil {
		return nil, "", "", err
	}
	apiDir := filepath.Join(n.stateDir, "api")
	ca, err := os.ReadFile(filepath.Join(apiDir, "ca.crt"))
	if err != nil {
		return nil, "", "", err
	}
	tok, err := os.ReadFile(filepath.Join(apiDir, "view.token"))
	if err != nil {
		return nil, "", "", err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return hc, strings.TrimSpace(string(server)), strings.TrimSpace(string(tok)), nil
}

// kubeAPI times GET pods as Table with n pods up, then measures noderun's
// CPU over the CPU window again with kubeWatches watches open (as Table,
// as kubectl get -w asks) and nothing changing: it must stay at idle.
func (b *bench) kubeAPI(ctx context.Context, n int) error {
	hc, server, tok, err := b.node.kubeClient()
	if err != nil {
		return fmt.Errorf("kubernetes API: %w", err)
	}
	get := func(ctx context.Context, path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Accept", tableAccept)
		resp, err := hc.Do(req)
		if err == nil && resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return resp, err
	}
	for range b.cfg.APIGets {
		t := time.Now()
		resp, err := get(ctx, "/api/v1/pods")
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		b.kube.tableGetMS = append(b.kube.tableGetMS, float64(time.Since(t))/float64(time.Millisecond))
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	b.kube.pods = n
	if err := b.usageRequests(ctx, get); err != nil {
		return err
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	added := make(chan int, kubeWatches)
	for range kubeWatches {
		resp, err := get(wctx, "/api/v1/pods?watch=true")
		if err != nil {
			return err
		}
		go func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			seen := 0
			for sc.Scan() {
				if seen++; seen == n {
					added <- seen // every pod's synthetic ADDED arrived
				}
			}
		}()
	}
	for range kubeWatches {
		select {
		case <-added:
		case <-time.After(waitTimeout):
			return fmt.Errorf("watches did not list %d pods", n)
		}
	}
	if err := sleep(ctx, settle); err != nil {
		return err
	}
	b.logf("steady state with %d pods and %d open watches: CPU over %s", n, kubeWatches, b.cfg.CPUWindow)
	cpu, host, err := b.cpuOver(ctx, b.cfg.CPUWindow)
	if err != nil {
		return err
	}
	// cpuOver's host figure is in cores' worth; this row is a share of all.
	b.kube.watchCPU, b.kube.watchHostBusy = cpu, host/float64(runtime.NumCPU())
	return nil
}

// usageCollection is longer than the node's usage cache (2 s): each timed
// request is a fresh collection of every pod's usage.
const usageCollection = 2100 * time.Millisecond

// usageRequests times GET /stats/summary (what kubectl top and a scrape
// cost) and noderun's CPU for it, after one untimed request that takes
// the first CPU samples.
func (b *bench) usageRequests(ctx context.Context, get func(context.Context, string) (*http.Response, error)) error {
	for i := range max(b.cfg.APIGets/3, 1) + 1 {
		if err := sleep(ctx, usageCollection); err != nil {
			return err
		}
		cpu0, err := b.node.cpuTime()
		if err != nil {
			return err
		}
		t := time.Now()
		resp, err := get(ctx, "/stats/summary")
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cpu1, cerr := b.node.cpuTime()
		if err != nil || cerr != nil {
			return errors.Join(err, cerr)
		}
		if i > 0 {
			b.kube.summaryMS = append(b.kube.summaryMS, float64(time.Since(t))/float64(time.Millisecond))
			b.kube.summaryCPUMS = append(b.kube.summaryCPUMS, float64(cpu1-cpu0)/float64(time.Millisecond))
		}
	}
	return nil
}

// kubeRows report them; the idle CPU with watches is held to the idle
// CPU without them (same pods, same window) plus a tenth of a percent.
func (m *measurements) kubeRows(k kubeMeasures, cfg Config) []Row {
	if k.pods == 0 {
		return nil
	}
	var rows []Row
	add := func(r Row) { rows = append(rows, r.finish()) }
	add(Row{Key: "kubeapi_get_pods_table", Measure: fmt.Sprintf("GET /api/v1/pods as Table (kubectl get pods), %d pods", k.pods), Unit: "ms",
		Noderun: statsOf(k.tableGetMS)})
	add(Row{Key: "kubeapi_usage_summary", Measure: fmt.Sprintf("GET /stats/summary, a fresh collection (kubectl top), %d pods", k.pods), Unit: "ms",
		Noderun: statsOf(k.summaryMS)})
	add(Row{Key: "kubeapi_usage_summary_cpu", Measure: fmt.Sprintf("noderun's CPU time for one GET /stats/summary, %d pods", k.pods), Unit: "ms",
		Noderun: statsOf(k.summaryCPUMS)})
	add(Row{Key: "kubeapi_watch_idle_cpu", Measure: fmt.Sprintf("CPU, %d pods, %d open watches, %s steady state", k.pods, kubeWatches, cfg.CPUWindow),
		Unit: "% of a core", Noderun: statsOf([]float64{k.watchCPU}),
		Kubelet: fmt.Sprintf("%.2f %% without watches", m.cpuPercent), target: atMost(m.cpuPercent+0.1, "% of a core")})
	return rows
}

// watchRunning opens a watch on the node's pods through its Kubernetes API,
// as kubectl get -w does, and returns once it is open. The function it
// returns waits until the watch told that each named pod is Running and
// returns when that event arrived. A watch, not a poll: what it times
// is noderun's, not a polling interval's, and it puts no load on noderun
// while the pods start.
func (n *node) watchRunning(ctx context.Context, names []string, timeout time.Duration) (func() (time.Time, error), error) {
	hc, server, tok, err := n.kubeClient()
	if err != nil {
		return nil, fmt.Errorf("kubernetes API: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, server+"/api/v1/pods?watch=true", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("watch pods: %s", resp.Status)
	}
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer resp.Body.Close()
		running := map[string]bool{}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			at := time.Now()
			var ev struct {
				Type   string `json:"type"`
				Object v1.Pod `json:"object"`
			}
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				done <- result{err: fmt.Errorf("watch pods: %w", err)}
				return
			}
			name := strings.TrimSuffix(ev.Object.Name, "-"+nodeName)
			if !slices.Contains(names, name) {
				continue
			}
			running[name] = ev.Type != "DELETED" && testnode.PodRunning(&ev.Object)
			ok := 0
			for _, r := range running {
				if r {
					ok++
				}
			}
			if ok == len(names) {
				done <- result{at: at}
				return
			}
		}
		done <- result{err: fmt.Errorf("watch pods ended: %v", sc.Err())}
	}()
	return func() (time.Time, error) {
		select {
		case r := <-done:
			return r.at, r.err
		case <-time.After(timeout):
			return time.Time{}, fmt.Errorf("%d pods not all Running in the Kubernetes API's watch after %s", len(names), timeout)
		}
	}, nil
}

package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"syscall"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

func metricsMux(reg *prometheus.Registry, helper *kubeletplugin.Helper, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if st := helper.RegistrationStatus(); st != nil && !st.PluginRegistered {
			http.Error(w, "not registered with the kubelet: "+st.Error, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

func serveHTTP(ctx context.Context, wg *sync.WaitGroup, srv *http.Server, fatal func(error)) error {
	return listenEventually(ctx, wg, srv.Addr, "metrics", fatal, func(ln net.Listener) { serveHTTPOn(ctx, wg, srv, ln) })
}

func serveHTTPOn(ctx context.Context, wg *sync.WaitGroup, srv *http.Server, ln net.Listener) {
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server")
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		// ctx is done: the shutdown gets its own deadline, and ctx's values.
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
}

// readinessService is the gRPC health service name the chart's readiness
// probe asks for (a contract with deploy/chart/carve/templates/daemonset.yaml).
const readinessService = "registration"

// serveHealth runs the standard gRPC health service for the DaemonSet's grpc
// liveness probe: SERVING while the kubelet plugin is up, NOT_SERVING while
// the kubelet reports a failed registration.
func serveHealth(ctx context.Context, wg *sync.WaitGroup, addr string, helper *kubeletplugin.Helper, fatal func(error)) error {
	return listenEventually(ctx, wg, addr, "health", fatal, func(ln net.Listener) { serveHealthOn(ctx, wg, ln, helper) })
}

func serveHealthOn(ctx context.Context, wg *sync.WaitGroup, ln net.Listener, helper *kubeletplugin.Helper) {
	hs := health.NewServer()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	update := func() {
		st := healthpb.HealthCheckResponse_SERVING
		rs := helper.RegistrationStatus()
		if rs != nil && !rs.PluginRegistered {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus("", st)
		// The readiness probe's service: ready once the kubelet has
		// registered the plugin, so that a rollout (and helm's --wait)
		// goes on only when claims on this node can be prepared.
		ready := healthpb.HealthCheckResponse_NOT_SERVING
		if rs != nil && rs.PluginRegistered {
			ready = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus(readinessService, ready)
	}
	update()
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				hs.Shutdown()
				srv.Stop()
				return
			case <-t.C:
				update()
			}
		}
	}()
}

// addrWait is how long an address may stay taken: longer than a replaced
// agent's termination grace period (the chart's default, 30 s) and its
// start-up beside the new one.
var addrWait = 2 * time.Minute

// listenEventually listens on addr and hands the listener to serve. Where
// another process holds the address, it keeps trying in the background and
// serves once it can: on the node's network (hostNetwork) a rolling
// update's new agent starts beside the one it replaces, which holds the
// ports until it stops; the kubelet's probe meanwhile reaches the old one.
// An address still taken after addrWait is another process's, or a
// misconfiguration (two of the agent's own on one port): fatal.
func listenEventually(ctx context.Context, wg *sync.WaitGroup, addr, what string, fatal func(error), serve func(net.Listener)) error {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		serve(ln)
		return nil
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s listener: %w", what, err)
	}
	klog.FromContext(ctx).Info("Address in use, by the agent this one replaces if in a rolling update; serving once it is free", "what", what, "address", addr)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		deadline := time.Now().Add(addrWait)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ln, err := net.Listen("tcp", addr)
			if err == nil {
				klog.FromContext(ctx).Info("Serving", "what", what, "address", addr)
				serve(ln)
				return
			}
			if time.Now().After(deadline) {
				fatal(fmt.Errorf("%s listener: %s still in use after %v: %w", what, addr, addrWait, err))
				return
			}
		}
	}()
	return nil
}

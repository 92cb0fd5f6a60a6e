package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-dra/carve/deploy/e2e/kubeletstub"
)

// The agent publishes its devices only once the kubelet has registered it,
// and reports ready (the chart's readiness probe: the gRPC health service
// "registration") only then: a pod placed on slices of a driver the kubelet
// does not know yet waits out the kubelet's back-off (70 s, measured on the
// local node after a reinstall). Without a kubelet it publishes anyway once
// --registration-wait runs out.
func TestAgentPublishesOnceRegistered(t *testing.T) {
	cs := client(t)
	ctx := context.Background()

	h := newAgentHost(t, cs, "e2e-agent-reg")
	h.noKubelet = true
	h.start()
	// Long enough for discovery and a publish that did not wait (under a
	// second here, TestAgentPrepareOverSocket).
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if n := sliceCount(t, cs, h.node); n > 0 {
			t.Fatalf("%d ResourceSlices published before the kubelet registered the plugin\n%s", n, h.logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := healthOf(t, h, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness while unregistered: %v, want SERVING (the agent is alive, waiting)", got)
	}
	if got := healthOf(t, h, "registration"); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness while unregistered: %v, want NOT_SERVING", got)
	}
	registered := time.Now()
	p, err := kubeletstub.Register(ctx, h.path("plugins_registry"), "carve.dev", 10*time.Second)
	if err != nil {
		t.Fatalf("register: %v\n%s", err, h.logs)
	}
	defer p.Close()
	waitSlices(t, cs, h)
	t.Logf("slices published %v after the registration", time.Since(registered).Round(time.Millisecond))
	waitFor(t, "readiness SERVING", 5*time.Second, func() (bool, error) {
		return healthOf(t, h, "registration") == healthpb.HealthCheckResponse_SERVING, nil
	})
	if err := h.stop(); err != nil {
		t.Errorf("SIGTERM: %v\n%s", err, h.logs)
	}

	// No kubelet at all: the devices are published once the wait runs out.
	lone := newAgentHost(t, cs, "e2e-agent-lone")
	lone.noKubelet = true
	lone.args = append(lone.args, "--registration-wait=2s")
	started := time.Now()
	lone.start()
	waitSlices(t, cs, lone)
	took := time.Since(started)
	t.Logf("without a kubelet: slices published %v after the start (--registration-wait=2s)", took.Round(time.Millisecond))
	if took < 2*time.Second {
		t.Errorf("slices published %v after the start, before the registration wait of 2s ran out", took)
	}
	if !strings.Contains(lone.logs.String(), "Not registered with the kubelet yet") {
		t.Errorf("the agent did not say why it published unregistered:\n%s", lone.logs)
	}
	if err := lone.stop(); err != nil {
		t.Errorf("SIGTERM: %v\n%s", err, lone.logs)
	}
}

func sliceCount(t testing.TB, cs kubernetes.Interface, node string) int {
	t.Helper()
	l, err := cs.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// healthOf asks the agent's gRPC health service about a service ("" is
// the liveness probe's); UNKNOWN where it cannot be asked yet.
func healthOf(t testing.TB, h *agentHost, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(h.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return r.Status
}

package e2e

import (
	"os"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// client connects to the local control plane, or skips (fails, where one is
// required) when there is none.
func client(t testing.TB) kubernetes.Interface {
	t.Helper()
	path := os.Getenv("CARVE_KUBECONFIG")
	if path == "" {
		if os.Getenv("CARVE_E2E_REQUIRED") == "1" {
			t.Fatal("CARVE_E2E_REQUIRED=1 but CARVE_KUBECONFIG is not set: run `make cluster-up`")
		}
		t.Skip("no control plane: CARVE_KUBECONFIG is not set (run `make cluster-up`, or `make test`)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", path, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

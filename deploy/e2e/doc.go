// Package e2e holds carve's tests against a real control plane started by
// deploy/cluster/up.sh (`make cluster-up`). They read the kubeconfig path
// from CARVE_KUBECONFIG; `make test` and `make e2e` set it. Without it they
// skip, unless CARVE_E2E_REQUIRED=1 says a cluster must be there.
package e2e

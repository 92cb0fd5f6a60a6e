// Package e2e holds the scheduler module's integration test against a real
// control plane without kubelets (scheduler/hack/cluster.sh up): the stock
// kube-scheduler and carve-scheduler bind twin pods on twin nodes, and their
// choices must differ exactly where ShareFit and Topology say they should.
// It skips unless CARVE_KUBECONFIG names the control plane.
package e2e

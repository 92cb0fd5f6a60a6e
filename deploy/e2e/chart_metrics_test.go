package e2e

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// The agent's metrics name every tenant's claims and have no
// authentication: the chart's defaults keep them on loopback, and opting in
// to the pod IP brings a NetworkPolicy admitting only the named scrapers, to
// the metrics port only, on the agent's pods only. helm alone; no cluster.
func TestChartMetricsStayOnLoopback(t *testing.T) {
	type rendered struct {
		args      []string
		podLabels labels.Set
		schedPod  labels.Set
		netpol    *networkingv1.NetworkPolicy
	}
	render := func(sets ...string) rendered {
		t.Helper()
		var r rendered
		for _, u := range decodeObjects(t, renderChart(t, append([]string{"scheduler.enabled=true"}, sets...)...)) {
			switch u.GetKind() {
			case "DaemonSet":
				var ds appsv1.DaemonSet
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ds); err != nil {
					t.Fatal(err)
				}
				r.args = ds.Spec.Template.Spec.Containers[0].Args
				r.podLabels = ds.Spec.Template.Labels
			case "Deployment":
				var d appsv1.Deployment
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
					t.Fatal(err)
				}
				r.schedPod = d.Spec.Template.Labels
			case "NetworkPolicy":
				r.netpol = &networkingv1.NetworkPolicy{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, r.netpol); err != nil {
					t.Fatal(err)
				}
			}
		}
		return r
	}

	def := render()
	if !slices.Contains(def.args, "--metrics-addr=127.0.0.1:9464") {
		t.Errorf("default agent args %q; want --metrics-addr=127.0.0.1:9464", def.args)
	}
	if def.netpol != nil {
		t.Errorf("a NetworkPolicy with metrics on loopback: %+v", def.netpol.Spec)
	}

	// Off loopback with no scraper named: the policy admits no one.
	closed := render("metricsHost=$(POD_IP)")
	if !slices.Contains(closed.args, "--metrics-addr=$(POD_IP):9464") {
		t.Errorf("agent args %q; want --metrics-addr=$(POD_IP):9464", closed.args)
	}
	if closed.netpol == nil {
		t.Fatal("no NetworkPolicy with metrics on the pod IP")
	}
	if len(closed.netpol.Spec.Ingress) != 0 || !slices.Contains(closed.netpol.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy with no scraper named: %+v; want every ingress denied", closed.netpol.Spec)
	}

	open := render("metricsHost=$(POD_IP)", "metricsPort=19464",
		"metricsNetworkPolicy.from[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
		"metricsNetworkPolicy.from[0].podSelector.matchLabels.app=prometheus")
	if open.netpol == nil {
		t.Fatal("no NetworkPolicy with a scraper named")
	}
	spec := open.netpol.Spec
	if len(spec.Ingress) != 1 || len(spec.Ingress[0].From) != 1 || len(spec.Ingress[0].Ports) != 1 ||
		spec.Ingress[0].Ports[0].Port.IntValue() != 19464 {
		t.Fatalf("NetworkPolicy ingress %+v; want the scraper, to port 19464 only", spec.Ingress)
	}
	peer := spec.Ingress[0].From[0]
	if peer.NamespaceSelector == nil || peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" ||
		peer.PodSelector == nil || peer.PodSelector.MatchLabels["app"] != "prometheus" {
		t.Errorf("NetworkPolicy peer %+v; want pods app=prometheus in namespace monitoring", peer)
	}
	sel, err := metav1.LabelSelectorAsSelector(&spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(open.podLabels) {
		t.Errorf("NetworkPolicy selector %s misses the agent's pods %v", sel, open.podLabels)
	}
	if open.schedPod == nil || sel.Matches(open.schedPod) {
		t.Errorf("NetworkPolicy selector %s takes in carve-scheduler's pods %v", sel, open.schedPod)
	}

	// Disabled: the operator's own policy instead.
	if r := render("metricsHost=$(POD_IP)", "metricsNetworkPolicy.enabled=false"); r.netpol != nil {
		t.Error("a NetworkPolicy with metricsNetworkPolicy.enabled=false")
	}
}

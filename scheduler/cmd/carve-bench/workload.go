package main

import (
	"context"
	"fmt"
	"math/rand/v2"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
	"github.com/carve-dra/carve/slices/names"
)

// Share sizes the claim templates ask for.
var (
	netSizes = []string{"5G", "10G", "20G"}
	gpuSizes = []string{"4Gi", "8Gi", "16Gi"}
)

// podSpec is one pod of the workload: the templates its claims use.
type podSpec struct {
	name string
	gpu  string // template name, or empty
	net  string
}

// workload is n pods, the same for every scheduler and run with the same
// seed: 40% a bandwidth share, 40% a GPU memory share, 20% both.
func workload(n int, seed uint64) []podSpec {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) //nolint:gosec // G404: a workload reproducible from its seed, not a secret
	out := make([]podSpec, n)
	for i := range out {
		p := podSpec{name: fmt.Sprintf("pod-%04d", i)}
		x := r.IntN(10)
		if x < 4 || x >= 8 {
			p.net = "net-" + netSizes[r.IntN(len(netSizes))]
		}
		if x >= 4 {
			p.gpu = "gpu-" + gpuSizes[r.IntN(len(gpuSizes))]
		}
		out[i] = p
	}
	return out
}

// createTemplates makes the namespace and its claim templates.
func createTemplates(ctx context.Context, c kubernetes.Interface, ns string) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	var tpls []*resourceapi.ResourceClaimTemplate
	for _, s := range netSizes {
		tpls = append(tpls, template(ns, "net-"+s, fixture.ShareSpec(names.KindNIC, map[resourceapi.QualifiedName]string{fixture.Egress: s, fixture.Ingress: s})))
	}
	for _, s := range gpuSizes {
		tpls = append(tpls, template(ns, "gpu-"+s, fixture.ShareSpec(names.KindGPU, map[resourceapi.QualifiedName]string{fixture.Memory: s})))
	}
	for _, t := range tpls {
		if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, t, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create template %s: %w", t.Name, err)
		}
	}
	return nil
}

func template(ns, name string, spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: lower(name)},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}
}

// lower makes a template name a valid object name (5G -> 5g).
func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// pod is the Pod object for p: it tolerates everything (no kubelet heartbeats
// here) and is never run, only bound.
func pod(ns, scheduler string, p podSpec) *v1.Pod {
	out := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.name},
		Spec: v1.PodSpec{
			SchedulerName: scheduler,
			Tolerations:   []v1.Toleration{{Operator: v1.TolerationOpExists}},
			Containers:    []v1.Container{{Name: "c", Image: "carve-test:latest"}},
		},
	}
	for _, claim := range []struct{ name, tpl string }{{"gpu", p.gpu}, {"net", p.net}} {
		if claim.tpl == "" {
			continue
		}
		out.Spec.ResourceClaims = append(out.Spec.ResourceClaims, v1.PodResourceClaim{Name: claim.name, ResourceClaimTemplateName: ptrTo(lower(claim.tpl))})
		out.Spec.Containers[0].Resources.Claims = append(out.Spec.Containers[0].Resources.Claims, v1.ResourceClaim{Name: claim.name})
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }

package perf

import (
	"fmt"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
	"github.com/carve-dra/carve/slices/names"
)

// carveCase is the test case of carve's own shape: every node is
// fixture.Server (2 GPUs of 80Gi memory and 2 NICs of 100G each way, one GPU
// and one NIC under each PCIe root, one root per NUMA node), with carve's
// device classes; pods ask for a bandwidth share (40%), a GPU memory share
// (40%) or both (20%), the mix and sizes carve-bench uses.
const carveCase = "CarveShares"

// carveDriver is the driver of carveCase's devices, which carve's plugins
// follow there (their default).
const carveDriver = fixture.Driver

// carveNode is the nodes' name; the slices' node names use the same.
const carveNode = "carve-perf-{{.Index}}"

// Share sizes, as carve-bench's workload: 5/10/20G of bandwidth each way,
// 4/8/16Gi of GPU memory.
var (
	netSizes = []string{"5G", "10G", "20G"}
	gpuSizes = []string{"4Gi", "8Gi", "16Gi"}
)

// carveWorkloads are the sizes of carveCase: 1000 pods at each size, as
// carve-bench measures, and 5000 where devices fill (at 500 nodes about 700
// of the 2000 devices at the least, so that first fit splits GPU+NIC pairs
// across roots).
var carveWorkloads = []struct {
	pods, nodes int
}{
	{1000, 100},
	{1000, 500},
	{5000, 500},
	{5000, 1000},
}

// carvePodTemplate is the pods' template. The harness renders it per pod
// with .Index (and its Mod): the kind cycles over ten pods (0-3 a NIC
// share, 4-7 a GPU share, 8-9 both) and the size over three, and as 10 and
// 3 are coprime every kind meets every size equally often.
const carvePodTemplate = `{{$kind := Mod .Index 10}}{{$size := Mod .Index 3}}
apiVersion: v1
kind: Pod
metadata:
  generateName: carve-perf-
spec:
  containers:
  - name: pause
    image: registry.k8s.io/pause:3.10.1
    resources:
      claims:{{if or (lt $kind 4) (ge $kind 8)}}
      - name: net{{end}}{{if ge $kind 4}}
      - name: gpu{{end}}
  resourceClaims:{{if or (lt $kind 4) (ge $kind 8)}}
  - name: net
    resourceClaimTemplateName: net-{{$size}}{{end}}{{if ge $kind 4}}
  - name: gpu
    resourceClaimTemplateName: gpu-{{$size}}{{end}}
`

// writeCarveCase writes carveCase's templates under dir and returns its
// selected workloads.
func writeCarveCase(dir string, sel selection, carveConfig string) ([]workload, error) {
	files := map[string]any{
		"node.yaml":  carveNodeObject(),
		"slice.yaml": typed(fixture.Server(carveNode, "100G", "80Gi"), "resource.k8s.io/v1", "ResourceSlice"),
	}
	var ops []map[string]any
	ops = append(ops,
		map[string]any{"opcode": "createNodes", "nodeTemplatePath": filepath.Join(dir, "node.yaml"), "countParam": "$nodes"},
		map[string]any{"opcode": "createAny", "templatePath": filepath.Join(dir, "slice.yaml"), "countParam": "$nodes"},
	)
	for _, c := range fixture.Classes() {
		name := "class-" + c.Name + ".yaml"
		files[name] = typed(c, "resource.k8s.io/v1", "DeviceClass")
		ops = append(ops, map[string]any{"opcode": "createAny", "templatePath": filepath.Join(dir, name)})
	}
	for i, s := range netSizes {
		spec := fixture.ShareSpec(names.KindNIC, map[resourceapi.QualifiedName]string{fixture.Egress: s, fixture.Ingress: s})
		files[fmt.Sprintf("net-%d.yaml", i)] = claimTemplate(fmt.Sprintf("net-%d", i), spec)
	}
	for i, s := range gpuSizes {
		spec := fixture.ShareSpec(names.KindGPU, map[resourceapi.QualifiedName]string{fixture.Memory: s})
		files[fmt.Sprintf("gpu-%d.yaml", i)] = claimTemplate(fmt.Sprintf("gpu-%d", i), spec)
	}
	for _, kind := range []string{"net", "gpu"} {
		for i := range 3 {
			ops = append(ops, map[string]any{"opcode": "createAny", "namespace": "test", "templatePath": filepath.Join(dir, fmt.Sprintf("%s-%d.yaml", kind, i))})
		}
	}
	ops = append(ops, map[string]any{
		"opcode": "createPods", "namespace": "test", "countParam": "$measurePods",
		"podTemplatePath": filepath.Join(dir, "pod.yaml"), "collectMetrics": true,
	})
	for name, obj := range files {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "pod.yaml"), []byte(carvePodTemplate), 0o600); err != nil {
		return nil, err
	}
	gates := map[string]bool{"DynamicResourceAllocation": true, "DRAConsumableCapacity": true}
	var out []workload
	for _, w := range carveWorkloads {
		wname := fmt.Sprintf("%dpods_%dnodes", w.pods, w.nodes)
		if !sel.wants(carveCase, wname, w.nodes) {
			continue
		}
		out = append(out, workload{
			Case: carveCase, Name: wname, Nodes: w.nodes, Shares: true,
			gates: gates, ops: ops, params: map[string]any{"nodes": w.nodes, "measurePods": w.pods}, carveConfig: carveConfig,
		})
	}
	return out, nil
}

// carveNodeObject is the nodes' template: Ready, room for the pods, named
// as the slices say (the harness substitutes .Index in both).
func carveNodeObject() *v1.Node {
	n := &v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: carveNode},
		Status: v1.NodeStatus{
			Capacity: v1.ResourceList{
				v1.ResourcePods:   resource.MustParse("110"),
				v1.ResourceCPU:    resource.MustParse("64"),
				v1.ResourceMemory: resource.MustParse("512Gi"),
			},
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
			Phase:      v1.NodeRunning,
		},
	}
	n.Status.Allocatable = n.Status.Capacity.DeepCopy()
	return n
}

func claimTemplate(name string, spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}
}

// typed sets obj's apiVersion and kind, which the harness's createAny needs
// and the fixture leaves out.
func typed[T runtime.Object](obj T, apiVersion, kind string) T {
	obj.GetObjectKind().SetGroupVersionKind(schema.FromAPIVersionAndKind(apiVersion, kind))
	return obj
}

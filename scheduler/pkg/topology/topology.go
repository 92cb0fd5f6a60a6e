// Package topology is the Topology score plugin: where a pod has share
// requests in several carve claims, it prefers nodes where the devices those
// claims would get sit under one PCIe root (a GPU and a NIC that talk without
// crossing the CPU), or failing that on one NUMA node.
package topology

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"sigs.k8s.io/yaml"

	"github.com/carve-dra/carve/scheduler/pkg/estimate"
)

// Name is the plugin's name in a scheduler profile.
const Name = "Topology"

// Scores for the alignment of a pod's devices on a node.
const (
	ScorePCIeRoot int64 = 100 // every device under one PCIe root
	ScoreNUMA     int64 = 50  // every device on one NUMA node
	ScoreApart    int64 = 0   // neither, or not known
)

// Args configures Topology:
//
//   - name: Topology
//     args: {driverName: carve.dev}
type Args struct {
	// DriverName is the DRA driver whose devices are compared (carve.dev).
	DriverName string `json:"driverName,omitempty"`
}

// DecodeArgs reads, defaults and validates the args strictly.
func DecodeArgs(obj runtime.Object) (Args, error) {
	var a Args
	if obj != nil {
		u, ok := obj.(*runtime.Unknown)
		if !ok {
			return Args{}, fmt.Errorf("%s args: want runtime.Unknown, got %T", Name, obj)
		}
		if len(u.Raw) > 0 {
			if err := yaml.UnmarshalStrict(u.Raw, &a); err != nil {
				return Args{}, fmt.Errorf("%s args: %w", Name, err)
			}
		}
	}
	if a.DriverName == "" {
		a.DriverName = "carve.dev"
	}
	if errs := validation.IsDNS1123Subdomain(a.DriverName); len(errs) > 0 {
		return Args{}, fmt.Errorf("%s args: driverName: %q: %v", Name, a.DriverName, errs)
	}
	return a, nil
}

// Topology scores nodes by the alignment of a pod's share devices.
type Topology struct {
	args   Args
	dra    fwk.SharedDRAManager
	ledger *estimate.Ledger
}

var (
	_ fwk.EnqueueExtensions = (*Topology)(nil)
	_ fwk.PreFilterPlugin   = (*Topology)(nil)
	_ fwk.PreScorePlugin    = (*Topology)(nil)
	_ fwk.ScorePlugin       = (*Topology)(nil)
	_ fwk.SignPlugin        = (*Topology)(nil)
)

// New is the plugin factory for app.WithPlugin.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	ledger, err := estimate.LedgerFor(logger, h.SharedInformerFactory(), args.DriverName)
	if err != nil {
		return nil, fmt.Errorf("%s: claim informer: %w", Name, err)
	}
	logger.V(2).Info("Topology configured", "driver", args.DriverName)
	return &Topology{args: args, dra: h.SharedDRAManager(), ledger: ledger}, nil
}

// Name implements fwk.Plugin.
func (t *Topology) Name() string { return Name }

// SignPod keeps pods with claims out of batching, as DynamicResources does.
func (t *Topology) SignPod(_ context.Context, pod *v1.Pod) ([]fwk.SignFragment, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) > 0 {
		return nil, fwk.NewStatus(fwk.Unschedulable, "pods with resource claims are not signable")
	}
	return nil, nil
}

// PreFilter marks the ledger as DynamicResources' allocator sees it in
// this cycle (see estimate.MarkCycle); it never rejects a pod.
func (t *Topology) PreFilter(_ context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	if len(pod.Spec.ResourceClaims) == 0 || t.dra == nil {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	estimate.MarkCycle(state, t.dra, t.ledger, t.args.DriverName)
	return nil, nil
}

// EventsToRegister implements fwk.EnqueueExtensions: Topology never rejects a
// pod, so no cluster event can make one schedulable. Without it the
// framework assumes a PreFilter or Reserve plugin cares about every event,
// and requeues unschedulable pods on each (measured: 2% of the scheduler's
// CPU in the benchmark, in the queue alone).
func (t *Topology) EventsToRegister(context.Context) ([]fwk.ClusterEventWithHint, error) {
	return nil, nil
}

// PreFilterExtensions implements fwk.PreFilterPlugin: there is no per-node
// state to update.
func (t *Topology) PreFilterExtensions() fwk.PreFilterExtensions { return nil }

// PreScore skips pods with share requests in fewer than two claims: within
// one claim, alignment is the claim's own business (a matchAttribute
// constraint the allocator enforces).
func (t *Topology) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if len(pod.Spec.ResourceClaims) < 2 || t.dra == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	e, err := estimate.ForCycle(ctx, state, t.dra, t.ledger, pod, t.args.DriverName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	if e == nil || e.Claims < 2 {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// Score ranks the node by where the pod's devices would sit there.
func (t *Topology) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	e, err := estimate.ForCycle(ctx, state, t.dra, t.ledger, pod, t.args.DriverName)
	if err != nil {
		return 0, fwk.AsStatus(err)
	}
	node := nodeInfo.Node().Name
	picks, ok := e.Picks(node)
	score := ScoreApart
	if ok {
		score = Score(picks)
	}
	klog.FromContext(ctx).V(6).Info("Topology score", "pod", klog.KObj(pod), "node", node, "score", score)
	return score, nil
}

// Score is ScorePCIeRoot when every picked device names the same PCIe root,
// ScoreNUMA when they share a NUMA node, else ScoreApart.
func Score(picks []estimate.Pick) int64 {
	if len(picks) < 2 {
		return ScoreApart
	}
	if same(picks, func(d *estimate.Device) string { return d.PCIeRoot }) {
		return ScorePCIeRoot
	}
	if same(picks, func(d *estimate.Device) string { return d.NUMANode }) {
		return ScoreNUMA
	}
	return ScoreApart
}

// same is true when key is known and equal for every picked device.
func same(picks []estimate.Pick, key func(*estimate.Device) string) bool {
	first := key(picks[0].Device)
	if first == "" {
		return false
	}
	for _, p := range picks[1:] {
		if key(p.Device) != first {
			return false
		}
	}
	return true
}

// ScoreExtensions implements fwk.ScorePlugin: scores are already 0..100.
func (t *Topology) ScoreExtensions() fwk.ScoreExtensions { return nil }

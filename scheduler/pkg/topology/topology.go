// Package topology is the Topology score plugin: where a pod has share
// requests in several carve claims, it prefers nodes where the devices those
// claims would get sit under one PCIe root (a GPU and a NIC that talk without
// crossing the CPU), or failing that on one NUMA node.
package topology

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/carve-dra/carve/scheduler/pkg/estimate"
	"github.com/carve-dra/carve/scheduler/pkg/shareplugin"
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
	// DriverArgs is driverName: the DRA driver whose devices are compared
	// (carve.dev).
	shareplugin.DriverArgs
}

// DecodeArgs reads, defaults and validates the args strictly.
func DecodeArgs(obj runtime.Object) (Args, error) {
	return shareplugin.DecodeArgs[Args](Name, obj)
}

// Topology scores nodes by the alignment of a pod's share devices. The
// embedded Base runs its extension points.
type Topology struct {
	shareplugin.Base
}

// Topology is a shareplugin.Plugin (EnqueueExtensions, PreFilterPlugin,
// PreScorePlugin, ScorePlugin, SignPlugin).
var _ shareplugin.Plugin = (*Topology)(nil)

// New is the plugin factory for app.WithPlugin.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	_, base, err := shareplugin.Setup[Args](ctx, obj, h, Name, nil)
	if err != nil {
		return nil, err
	}
	return newTopology(base), nil
}

// newTopology is Topology over base.
func newTopology(base shareplugin.Base) *Topology {
	base.Scoring = scoring
	return &Topology{Base: base}
}

// scoring ranks a node by where the pod's devices would sit there. It
// skips pods with share requests in fewer than two claims: within one
// claim, alignment is the claim's own business (a matchAttribute
// constraint the allocator enforces).
var scoring = shareplugin.Scoring{
	MinClaims: 2,
	Scores:    func(e *estimate.Estimate) bool { return e.Claims >= 2 },
	Score: func(picks []estimate.Pick, ok bool) int64 {
		if !ok {
			return ScoreApart
		}
		return Score(picks)
	},
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

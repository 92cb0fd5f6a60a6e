package app

import (
	"context"
	"path/filepath"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/nvmlinfo"
	"github.com/carve-dra/carve/gpu"
	"github.com/carve-dra/carve/gpu/memslice"
	"github.com/carve-dra/carve/gpu/mps"
	"github.com/carve-dra/carve/gpu/police"
	runtimehook "github.com/carve-dra/carve/prepare/hook"
	"github.com/carve-dra/carve/prepare/hostcgroup"
	"github.com/carve-dra/carve/prepare/hostmount"
)

// gpuMemory chooses each GPU's memory enforcement tier once, the first
// time the GPU is seen, and runs the policing loop of mps-policed shares.
type gpuMemory struct {
	env    memslice.Env
	mu     sync.Mutex
	chosen map[string]memslice.Choice
	police *police.Police
	shares *memslice.Manager
	// lanes are the policing loop's NVML lanes, one per GPU: a GPU whose
	// lane is wedged is unhealthy, and takes no new mps-policed share.
	lanes *gpu.Lanes
}

// openGPUMemory wires GPU memory shares: the manager, the policing loop
// (running until ctx ends) with the claim's reserved pods and pod events
// from the API server.
func openGPUMemory(ctx context.Context, opts Options, s *gpu.Session, hook hookBinary) *gpuMemory {
	logger := klog.FromContext(ctx).WithName("gpumem")
	g := &gpuMemory{env: memslice.EnvBelow(opts.Root, opts.NVIDIADriverRoot), chosen: map[string]memslice.Choice{}}
	if s == nil {
		return g
	}
	// The loop's process queries go through lanes of the session, one per
	// GPU: the preparer's calls (the CDI library's file walk, MIG
	// creates) hold the session's own turn for seconds, and a tick must
	// not wait on them, nor one GPU's hung query stop the others'.
	g.lanes = s.GPULanes()
	popts := police.Options{Processes: g.lanes, ProcRoot: filepath.Join(firstSet(opts.Root), "proc"),
		StateFile: filepath.Join(opts.StateDir, memslice.UsageFile), Logger: logger}
	if opts.KubeClient != nil {
		popts.Owners = claimOwners{opts.KubeClient}
		popts.Recorder = podEvents(opts.KubeClient, opts.NodeName)
	}
	g.police = police.New(popts)
	go g.police.Run(ctx)
	control := gpu.FindFile(g.env.DriverRoot, []string{"usr/bin", "bin", "usr/local/bin"}, mps.Binary)
	mopts := memslice.Options{NVML: s, DriverLibDirs: gpu.LibraryDirs(g.env.DriverRoot), Dir: filepath.Join(opts.StateDir, memslice.SharesDir), ShmDir: filepath.Join(opts.StateDir, "mps-shm"), ShmSize: opts.MPSShmSize,
		MPSControl: control, HookPath: hook.path, HookArgs: hook.argv("dmem-limit"), CgroupRoot: runtimehook.DefaultCgroupRoot, Police: g.police, Policing: g.lanes.Wedged, DaemonCapabilities: opts.MPSCapabilities, ContextReserve: opts.MPSContextReserve, Logger: logger}
	if root := firstSet(opts.Root); root != "/" {
		// Containers get the host's view of each claim's tmpfs: check
		// that it has one, through the root of the runtime's shim (live,
		// whatever the host root mount's propagation), else the host
		// root mount.
		mopts.HostRoot = root
		if hostRoot, err := hostmount.RuntimeRoot(); err == nil {
			mopts.HostRoot = hostRoot
		}
		// The daemons start from the runtime's (the host's) mount
		// namespace, so that they and their servers load the host's
		// driver libraries rather than the agent image's; the control
		// binary is then found by its host path. Where that namespace
		// cannot be entered, they start from the agent's, as before.
		if ns, err := hostmount.RuntimeNamespace(); err == nil {
			mopts.Start = mps.StartInNamespace(ns, root)
			if opts.MPSCgroup != "" {
				mopts.Keeper = hostcgroup.FromNamespaces{Group: hostcgroup.Group{Name: opts.MPSCgroup}, NSDir: filepath.Dir(ns)}
			}
		} else {
			logger.Info("MPS daemons start from the agent's mount namespace", "reason", err.Error())
		}
	}
	g.shares = memslice.New(mopts)
	return g
}

// tiers is the inventory's GPUMemory: each GPU's tier, chosen at start.
func (g *gpuMemory) tiers(ctx context.Context, inv *nvmlinfo.Inventory) map[string]discovery.GPUMemory {
	if inv == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var fresh *nvmlinfo.Inventory
	for _, d := range inv.Devices {
		if _, ok := g.chosen[d.UUID]; !ok {
			if fresh == nil {
				fresh = &nvmlinfo.Inventory{DriverVersion: inv.DriverVersion, CUDADriverVersion: inv.CUDADriverVersion}
			}
			fresh.Devices = append(fresh.Devices, d)
		}
	}
	if fresh != nil {
		for uuid, c := range memslice.Detect(fresh, g.env) {
			if c.Tier == memslice.TierMPSPoliced && g.shares != nil {
				// The tier's clients meet their daemon in a tmpfs that
				// must show on the host; without it, say so now rather
				// than at every prepare.
				if err := g.shares.CheckShm(); err != nil {
					c = memslice.Choice{Tier: memslice.TierNone, Reason: "mps-policed needs its shared memory tmpfs on the host: " + err.Error()}
				}
			}
			g.chosen[uuid] = c
			klog.FromContext(ctx).Info("GPU memory enforcement chosen", "gpu", uuid, "tier", c.Tier, "reason", c.Reason)
		}
	}
	out := map[string]discovery.GPUMemory{}
	for _, d := range inv.Devices {
		c := g.chosen[d.UUID]
		if g.shares == nil {
			c = memslice.Choice{Tier: memslice.TierNone, Reason: "no NVML session"}
		}
		out[d.UUID] = c.GPUMemory()
	}
	return out
}

// claimOwners reads a claim's reserved pods from the API server.
type claimOwners struct{ client kubernetes.Interface }

func (c claimOwners) ReservedPods(ctx context.Context, namespace, name string) ([]police.PodRef, error) {
	claim, err := c.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out []police.PodRef
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out = append(out, police.PodRef{Namespace: namespace, Name: r.Name, UID: r.UID})
		}
	}
	return out, nil
}

// eventRecorder records pod events through client-go's broadcaster.
type eventRecorder struct{ rec record.EventRecorder }

func podEvents(client kubernetes.Interface, node string) eventRecorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return eventRecorder{b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "carve", Host: node})}
}

func (e eventRecorder) PodEvent(pod police.PodRef, reason, message string) {
	e.rec.Event(&corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		corev1.EventTypeWarning, reason, message)
}

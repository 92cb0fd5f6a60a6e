package perf

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"

	"github.com/carve-dra/carve/slices/names"
)

// placement is where a run's pods' claims were allocated, read from the
// cluster once the workload is done. Only claims a pod uses count (reserved
// for or owned by one): claims the harness allocated itself (upstream's
// allocResourceClaims) show no scheduler's choice. In steady-state
// workloads the harness deletes every measured pod once it is scheduled, so
// what is left there is the init pods' claims, if any.
type placement struct {
	// Claims is the number of allocated claims counted.
	Claims int
	// Used is the devices they hold; Minimum the fewest that could hold the
	// same allocations: per group of alike devices (same driver and carve
	// kind, or same capacity names), each whole device counts one, and the
	// shares need at least their total over the group's largest device,
	// per capacity, and at least as many devices as one claim's shares
	// there (a claim's devices are distinct).
	Used, Minimum int
	// Pairs is the pods holding a carve GPU and a carve NIC; Aligned those
	// of them whose two share a PCIe root.
	Pairs, Aligned int
	// Drivers are the drivers of the devices counted.
	Drivers []string
	// Err is why the cluster could not be read.
	Err string
}

// device is what placement needs of a published device.
type device struct {
	group    string
	root     string
	kind     string
	capacity map[resourceapi.QualifiedName]float64
}

// computePlacement measures claims against the devices slices publish.
func computePlacement(slicesList []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim) placement {
	devices := map[string]device{}
	largest := map[string]map[resourceapi.QualifiedName]float64{} // group -> capacity -> largest device's
	for _, s := range slicesList {
		for _, d := range s.Spec.Devices {
			dev := describe(s.Spec.Driver, d)
			devices[s.Spec.Driver+"/"+s.Spec.Pool.Name+"/"+d.Name] = dev
			if largest[dev.group] == nil {
				largest[dev.group] = map[resourceapi.QualifiedName]float64{}
			}
			for n, v := range dev.capacity {
				largest[dev.group][n] = max(largest[dev.group][n], v)
			}
		}
	}
	var p placement
	used := map[string]bool{}
	whole := map[string]int{}                                      // group -> devices allocated whole
	consumed := map[string]map[resourceapi.QualifiedName]float64{} // group -> capacity -> total of shares
	perClaim := map[string]int{}                                   // group -> most shared devices of one claim
	roots := map[string]map[string]string{}                        // pod -> carve kind -> root
	drivers := map[string]bool{}
	for _, c := range claims {
		pod := consumer(&c)
		if c.Status.Allocation == nil || pod == "" {
			continue
		}
		p.Claims++
		shared := map[string]map[string]bool{} // group -> devices of this claim's shares
		for _, r := range c.Status.Allocation.Devices.Results {
			id := r.Driver + "/" + r.Pool + "/" + r.Device
			dev, ok := devices[id]
			if !ok {
				// A device no slice shows (its slice gone) still is one in use.
				dev = device{group: r.Driver + "/?"}
			}
			used[id] = true
			drivers[r.Driver] = true
			if r.ShareID == nil {
				whole[dev.group]++
			} else {
				if consumed[dev.group] == nil {
					consumed[dev.group] = map[resourceapi.QualifiedName]float64{}
				}
				for n, q := range r.ConsumedCapacity {
					consumed[dev.group][n] += q.AsApproximateFloat64()
				}
				if shared[dev.group] == nil {
					shared[dev.group] = map[string]bool{}
				}
				shared[dev.group][id] = true
			}
			if dev.kind == names.KindGPU || dev.kind == names.KindNIC {
				key := c.Namespace + "/" + pod
				if roots[key] == nil {
					roots[key] = map[string]string{}
				}
				roots[key][dev.kind] = dev.root
			}
		}
		for g, ids := range shared {
			perClaim[g] = max(perClaim[g], len(ids))
		}
	}
	p.Used = len(used)
	groups := map[string]bool{}
	for g := range whole {
		groups[g] = true
	}
	for g := range consumed {
		groups[g] = true
	}
	for g := range groups {
		need := perClaim[g]
		for n, total := range consumed[g] {
			if per := largest[g][n]; per > 0 {
				need = max(need, int(math.Ceil(total/per-1e-9)))
			}
		}
		p.Minimum += whole[g] + need
	}
	for _, r := range roots {
		gpu, okG := r[names.KindGPU]
		nic, okN := r[names.KindNIC]
		if okG && okN {
			p.Pairs++
			if gpu != "" && gpu == nic {
				p.Aligned++
			}
		}
	}
	for d := range drivers {
		p.Drivers = append(p.Drivers, d)
	}
	sort.Strings(p.Drivers)
	return p
}

// describe groups d: by carve's kind attribute where it has one, else by its
// capacity names (upstream's devices have no kind).
func describe(driver string, d resourceapi.Device) device {
	dev := device{capacity: map[resourceapi.QualifiedName]float64{}}
	for _, name := range []resourceapi.QualifiedName{names.AttrKind, resourceapi.QualifiedName(driver + "/" + names.AttrKind)} {
		if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
			dev.kind = *a.StringValue
		}
	}
	if a, ok := d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot]; ok && a.StringValue != nil {
		dev.root = *a.StringValue
	}
	var capNames []string
	for n, c := range d.Capacity {
		dev.capacity[n] = c.Value.AsApproximateFloat64()
		capNames = append(capNames, string(n))
	}
	slices.Sort(capNames)
	if dev.kind != "" {
		dev.group = driver + "/kind=" + dev.kind
	} else {
		dev.group = driver + "/" + strings.Join(capNames, ",")
	}
	return dev
}

// consumer is the pod a claim is for: the first pod it is reserved for, else
// the pod owning it (a claim from a template), else "".
func consumer(c *resourceapi.ResourceClaim) string {
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" {
			return r.Name
		}
	}
	for _, o := range c.OwnerReferences {
		if o.Kind == "Pod" {
			return o.Name
		}
	}
	return ""
}

// recorder keeps each run's placement, by run key (<Case>/<Workload>/<Scheduler>).
type recorder struct {
	mu   sync.Mutex
	runs map[string]placement
}

func newRecorder() *recorder { return &recorder{runs: map[string]placement{}} }

// prepare is the harness's prepare hook: it runs once the run's control
// plane and scheduler are up, before the workload's ops. It registers the
// measurement as a cleanup of the run: cleanups run last-registered first,
// so it comes after the workload (the harness's own cleanup from within the
// workload, which waits for its ops, registers later) and before the
// harness stops the scheduler and the API server (registered earlier).
func (r *recorder) prepare(tCtx ktesting.TContext) error {
	tb := tCtx.TB()
	client := tCtx.Client()
	key := runKey(tb.Name())
	tb.Cleanup(func() {
		// The run's context may be cancelled by now (a failed op); the API
		// server is still up.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		p, err := readPlacement(ctx, client)
		if err != nil {
			p.Err = err.Error()
		}
		r.mu.Lock()
		r.runs[key] = p
		r.mu.Unlock()
	})
	return nil
}

func (r *recorder) get(key string) (placement, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.runs[key]
	return p, ok
}

// runKey is the run's key in its full name, Benchmark.../<key>/runWorkload.
func runKey(name string) string {
	name = strings.TrimSuffix(name, "/"+runWorkload)
	if i := strings.Index(name, "/"); i >= 0 {
		return name[i+1:]
	}
	return name
}

func readPlacement(ctx context.Context, c kubernetes.Interface) (placement, error) {
	sl, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return placement{}, fmt.Errorf("list slices: %w", err)
	}
	cl, err := c.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return placement{}, fmt.Errorf("list claims: %w", err)
	}
	return computePlacement(sl.Items, cl.Items), nil
}

package sharefit

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/carve-dra/carve/scheduler/pkg/shareplugin"
)

// Strategy is how ShareFit ranks the fill of the devices a pod would get.
type Strategy string

const (
	// MostAllocated prefers nodes whose devices would be fullest: shares pack
	// onto few devices and leave whole devices free.
	MostAllocated Strategy = "MostAllocated"
	// LeastAllocated prefers nodes whose devices would be emptiest: shares
	// spread, and each has the most headroom to burst.
	LeastAllocated Strategy = "LeastAllocated"
)

// Args configures ShareFit in a KubeSchedulerConfiguration's pluginConfig:
//
//   - name: ShareFit
//     args: {strategy: MostAllocated, driverName: carve.dev}
type Args struct {
	// Strategy is MostAllocated (default) or LeastAllocated.
	Strategy Strategy `json:"strategy,omitempty"`
	// DriverArgs is driverName: the DRA driver whose devices are scored
	// (carve.dev).
	shareplugin.DriverArgs
}

// SetDefaults fills what the configuration left out.
func (a *Args) SetDefaults() {
	if a.Strategy == "" {
		a.Strategy = MostAllocated
	}
	a.DriverArgs.SetDefaults()
}

// Validate reports the first invalid field, by its name.
func (a *Args) Validate() error {
	switch a.Strategy {
	case MostAllocated, LeastAllocated:
	default:
		return fmt.Errorf("strategy: %q is not one of %s, %s", a.Strategy, MostAllocated, LeastAllocated)
	}
	return a.DriverArgs.Validate()
}

// DecodeArgs reads the plugin's args (nil means all defaults), defaults and
// validates them. Unknown fields are an error.
func DecodeArgs(obj runtime.Object) (Args, error) {
	return shareplugin.DecodeArgs[Args](Name, obj)
}

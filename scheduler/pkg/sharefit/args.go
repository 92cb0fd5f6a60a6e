package sharefit

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
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

// DefaultDriverName is carve's DRA driver.
const DefaultDriverName = "carve.dev"

// Args configures ShareFit in a KubeSchedulerConfiguration's pluginConfig:
//
//   - name: ShareFit
//     args: {strategy: MostAllocated, driverName: carve.dev}
type Args struct {
	// Strategy is MostAllocated (default) or LeastAllocated.
	Strategy Strategy `json:"strategy,omitempty"`
	// DriverName is the DRA driver whose devices are scored (carve.dev).
	DriverName string `json:"driverName,omitempty"`
}

// SetDefaults fills what the configuration left out.
func (a *Args) SetDefaults() {
	if a.Strategy == "" {
		a.Strategy = MostAllocated
	}
	if a.DriverName == "" {
		a.DriverName = DefaultDriverName
	}
}

// Validate reports the first invalid field, by its name.
func (a *Args) Validate() error {
	switch a.Strategy {
	case MostAllocated, LeastAllocated:
	default:
		return fmt.Errorf("strategy: %q is not one of %s, %s", a.Strategy, MostAllocated, LeastAllocated)
	}
	if errs := validation.IsDNS1123Subdomain(a.DriverName); len(errs) > 0 {
		return fmt.Errorf("driverName: %q: %v", a.DriverName, errs)
	}
	return nil
}

// DecodeArgs reads the plugin's args (nil means all defaults), defaults and
// validates them. Unknown fields are an error.
func DecodeArgs(obj runtime.Object) (Args, error) {
	var a Args
	if obj != nil {
		u, ok := obj.(*runtime.Unknown)
		if !ok {
			return Args{}, fmt.Errorf("%s args: want runtime.Unknown, got %T", Name, obj)
		}
		// JSON is YAML, so one strict decoder serves both content types.
		if len(u.Raw) > 0 {
			if err := yaml.UnmarshalStrict(u.Raw, &a); err != nil {
				return Args{}, fmt.Errorf("%s args: %w", Name, err)
			}
		}
	}
	a.SetDefaults()
	if err := a.Validate(); err != nil {
		return Args{}, fmt.Errorf("%s args: %w", Name, err)
	}
	return a, nil
}

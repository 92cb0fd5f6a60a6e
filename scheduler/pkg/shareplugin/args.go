package shareplugin

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// DefaultDriverName is carve's DRA driver, the plugins' default driverName.
const DefaultDriverName = "carve.dev"

// Args is what a plugin's args do after decoding: fill in what the
// configuration left out, report the first invalid field by its name, and
// name the driver the plugin follows.
type Args interface {
	SetDefaults()
	Validate() error
	Driver() string
}

// DriverArgs is the field the args of every carve plugin have; each plugin's
// Args embeds it (its field stands inline in the configuration).
type DriverArgs struct {
	// DriverName is the DRA driver whose devices the plugin follows
	// (carve.dev).
	DriverName string `json:"driverName,omitempty"`
}

// SetDefaults fills what the configuration left out.
func (a *DriverArgs) SetDefaults() {
	if a.DriverName == "" {
		a.DriverName = DefaultDriverName
	}
}

// Validate reports a driverName that is not a DNS subdomain.
func (a *DriverArgs) Validate() error {
	if errs := validation.IsDNS1123Subdomain(a.DriverName); len(errs) > 0 {
		return fmt.Errorf("driverName: %q: %v", a.DriverName, errs)
	}
	return nil
}

// Driver is the driverName.
func (a *DriverArgs) Driver() string { return a.DriverName }

// DecodeArgs reads the args of the plugin named name (nil means all
// defaults), defaults and validates them. Unknown fields are an error.
func DecodeArgs[A any, P interface {
	*A
	Args
}](name string, obj runtime.Object) (A, error) {
	var a, none A
	if obj != nil {
		u, ok := obj.(*runtime.Unknown)
		if !ok {
			return none, fmt.Errorf("%s args: want runtime.Unknown, got %T", name, obj)
		}
		// JSON is YAML, so one strict decoder serves both content types.
		if len(u.Raw) > 0 {
			if err := yaml.UnmarshalStrict(u.Raw, &a); err != nil {
				return none, fmt.Errorf("%s args: %w", name, err)
			}
		}
	}
	P(&a).SetDefaults()
	if err := P(&a).Validate(); err != nil {
		return none, fmt.Errorf("%s args: %w", name, err)
	}
	return a, nil
}

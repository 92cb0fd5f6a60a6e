package v1alpha1

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Scheme holds carve.dev/v1alpha1 alone.
var Scheme = runtime.NewScheme()

// strictDecoder fails on unknown and duplicate fields.
var strictDecoder runtime.Decoder

func init() {
	utilruntime.Must(AddToScheme(Scheme))
	strictDecoder = serializer.NewCodecFactory(Scheme, serializer.EnableStrict).UniversalDeserializer()
}

// Decode strictly decodes one opaque parameter of this group, applies its
// defaults and validates it. Every error names the field, under path: an
// apiVersion or kind this group does not have, an unknown field, a bad
// value. The result is a *DeviceConfig, a *NetworkConfig or a *GPUConfig.
func Decode(raw []byte, path *field.Path) (runtime.Object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %w", path, err)
	}
	if head.APIVersion != SchemeGroupVersion.String() {
		return nil, field.Invalid(path.Child("apiVersion"), head.APIVersion, "must be "+SchemeGroupVersion.String())
	}
	if !Scheme.Recognizes(SchemeGroupVersion.WithKind(head.Kind)) {
		return nil, field.NotSupported(path.Child("kind"), head.Kind, []string{DeviceConfigKind, NetworkConfigKind, GPUConfigKind})
	}
	obj, _, err := strictDecoder.Decode(raw, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	Scheme.Default(obj)
	var errs field.ErrorList
	switch c := obj.(type) {
	case *DeviceConfig:
		errs = ValidateDeviceConfig(c, path)
	case *NetworkConfig:
		errs = ValidateNetworkConfig(c, path)
	case *GPUConfig:
		errs = ValidateGPUConfig(c, path)
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return obj, nil
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of carve's configuration.
const GroupName = "carve.dev"

// SchemeGroupVersion is carve.dev/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers the kinds and their defaulting functions.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes, addDefaultingFuncs)
	// AddToScheme adds carve.dev/v1alpha1 to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &DeviceConfig{}, &NetworkConfig{}, &GPUConfig{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}

func addDefaultingFuncs(scheme *runtime.Scheme) error {
	scheme.AddTypeDefaultingFunc(&DeviceConfig{}, func(obj any) { SetDefaultsDeviceConfig(obj.(*DeviceConfig)) })
	scheme.AddTypeDefaultingFunc(&NetworkConfig{}, func(obj any) { SetDefaultsNetworkConfig(obj.(*NetworkConfig)) })
	scheme.AddTypeDefaultingFunc(&GPUConfig{}, func(obj any) { SetDefaultsGPUConfig(obj.(*GPUConfig)) })
	return nil
}

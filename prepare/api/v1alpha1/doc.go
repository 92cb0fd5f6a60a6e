// Package v1alpha1 is carve's opaque device configuration, carve.dev/v1alpha1:
// the DeviceConfig and NetworkConfig kinds that a DeviceClass or a claim puts
// in its opaque parameters, registered in a runtime.Scheme with defaulting,
// validation and strict decoding.
//
// +k8s:deepcopy-gen=package
// +groupName=carve.dev
package v1alpha1

//go:generate go run k8s.io/code-generator/cmd/deepcopy-gen@v0.37.0 --output-file zz_generated.deepcopy.go --go-header-file /dev/null .

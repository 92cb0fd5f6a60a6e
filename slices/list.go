package slices

import (
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// list is a v1 List, the shape `kubectl get -o yaml` prints and
// `kubectl apply -f` takes.
type list struct {
	APIVersion string                      `json:"apiVersion"`
	Kind       string                      `json:"kind"`
	Items      []resourceapi.ResourceSlice `json:"items"`
}

// Encode renders slices as a v1 List in "yaml" or "json".
func Encode(items []resourceapi.ResourceSlice, format string) ([]byte, error) {
	if items == nil {
		items = []resourceapi.ResourceSlice{}
	}
	l := list{APIVersion: "v1", Kind: "List", Items: items}
	switch format {
	case "yaml", "":
		return yaml.Marshal(l)
	case "json":
		b, err := json.MarshalIndent(l, "", "  ")
		return append(b, '\n'), err
	default:
		return nil, fmt.Errorf("output format %q: must be yaml or json", format)
	}
}

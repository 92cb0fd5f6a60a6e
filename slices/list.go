package slices

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

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
	switch format {
	case "yaml", "":
		return yaml.Marshal(list{APIVersion: "v1", Kind: "List", Items: items})
	case "json":
		return encodeJSON(items)
	default:
		return nil, fmt.Errorf("output format %q: must be yaml or json", format)
	}
}

// The List around the items as json.MarshalIndent(list, "", "  ") writes
// it; items sit two levels deep, so each is indented with the prefix
// itemPrefix. TestEncodeJSONAsMarshalIndent holds these to encoding/json.
const (
	listHead   = "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": ["
	itemPrefix = "    "
	listTail   = "\n  ]\n}\n"
)

// encodeJSON is json.MarshalIndent of the List, byte for byte, with its
// items marshaled on up to GOMAXPROCS goroutines: a large node's 2,000
// devices take encoding/json some 100 ms of CPU (reflection, the attribute
// maps' sorted keys, then the indenting pass), most of `carve discover`'s
// time after discovery. The items are independent, so each is marshaled
// and indented alone, and joined as the whole would have been.
func encodeJSON(items []resourceapi.ResourceSlice) ([]byte, error) {
	if len(items) == 0 {
		b, err := json.MarshalIndent(list{APIVersion: "v1", Kind: "List", Items: items}, "", "  ")
		return append(b, '\n'), err
	}
	parts := make([][]byte, len(items))
	errs := make([]error, len(items))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(items)) {
		// Items differ in size: each goroutine takes the next one.
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(items); i = int(next.Add(1) - 1) {
				var b []byte
				if b, errs[i] = json.Marshal(&items[i]); errs[i] == nil {
					out := bytes.NewBuffer(make([]byte, 0, 2*len(b)))
					errs[i] = json.Indent(out, b, itemPrefix, "  ")
					parts[i] = out.Bytes()
				}
			}
		})
	}
	wg.Wait()
	size := len(listHead) + len(listTail)
	for i, p := range parts {
		if errs[i] != nil {
			return nil, errs[i]
		}
		size += len(p) + len(",\n"+itemPrefix)
	}
	out := bytes.NewBuffer(make([]byte, 0, size))
	out.WriteString(listHead)
	for i, p := range parts {
		if i > 0 {
			out.WriteByte(',')
		}
		out.WriteString("\n" + itemPrefix)
		out.Write(p)
	}
	out.WriteString(listTail)
	return out.Bytes(), nil
}

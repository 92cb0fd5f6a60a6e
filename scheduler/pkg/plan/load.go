package plan

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	resourcedefaults "k8s.io/kubernetes/pkg/apis/resource/v1"
)

// Load reads ResourceSlices, ResourceClaims and DeviceClasses from YAML or
// JSON files (several documents per file, and v1 Lists, as `kubectl get -o
// yaml` and `carve discover` print them), appending them to in. They get the
// defaults the API server would give them (a request's allocationMode and
// count, say). Objects of other kinds are an error naming the file.
func (in *Input) Load(paths ...string) error {
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		if err := in.decode(data); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

func (in *Input) decode(data []byte) error {
	r := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for i := 0; ; i++ {
		var raw runtime.RawExtension
		if err := r.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 || string(bytes.TrimSpace(raw.Raw)) == "null" {
			continue
		}
		if err := in.add(raw.Raw); err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
	}
}

func (in *Input) add(raw []byte) error {
	obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
	if err != nil {
		return err
	}
	switch o := obj.(type) {
	case *resourceapi.ResourceSlice:
		resourcedefaults.SetObjectDefaults_ResourceSlice(o)
		in.Slices = append(in.Slices, o)
	case *resourceapi.ResourceClaim:
		resourcedefaults.SetObjectDefaults_ResourceClaim(o)
		in.Claims = append(in.Claims, o)
	case *resourceapi.DeviceClass:
		in.Classes = append(in.Classes, o)
	case *resourceapi.ResourceSliceList:
		resourcedefaults.SetObjectDefaults_ResourceSliceList(o)
		for i := range o.Items {
			in.Slices = append(in.Slices, &o.Items[i])
		}
	case *resourceapi.ResourceClaimList:
		resourcedefaults.SetObjectDefaults_ResourceClaimList(o)
		for i := range o.Items {
			in.Claims = append(in.Claims, &o.Items[i])
		}
	case *resourceapi.DeviceClassList:
		for i := range o.Items {
			in.Classes = append(in.Classes, &o.Items[i])
		}
	case *corev1.List:
		for j, item := range o.Items {
			if err := in.add(item.Raw); err != nil {
				return fmt.Errorf("list item %d: %w", j, err)
			}
		}
	default:
		return fmt.Errorf("unexpected %s: want ResourceSlice, ResourceClaim or DeviceClass (resource.k8s.io/v1)", gvk)
	}
	return nil
}

// LoadCluster reads every ResourceSlice, ResourceClaim (of namespace, or all
// namespaces when empty) and DeviceClass from the API server.
func (in *Input) LoadCluster(ctx context.Context, client kubernetes.Interface, namespace string) error {
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list resource slices: %w", err)
	}
	for i := range slices.Items {
		in.Slices = append(in.Slices, &slices.Items[i])
	}
	claims, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list resource claims: %w", err)
	}
	for i := range claims.Items {
		in.Claims = append(in.Claims, &claims.Items[i])
	}
	classes, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list device classes: %w", err)
	}
	for i := range classes.Items {
		in.Classes = append(in.Classes, &classes.Items[i])
	}
	return nil
}

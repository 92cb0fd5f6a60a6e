package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/carve-dra/carve/prepare/api/v1alpha1"
)

// The chart's nic DeviceClass names the pools its claims may use: by
// default the node config's pool where it has one, and none where it has
// several (closed by default: one class for every tenant would let each
// take the others' subnets; the rendering says so), or those
// nicClassAllowedPools lists, or none. What it renders is a NetworkConfig
// the agent decodes, with the pools as allowedPools.
func TestChartNICClassAllowsItsPools(t *testing.T) {
	onePool := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(onePool, []byte(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  pools:
  - name: tenant-a
    cidr: 10.80.0.0/24
`), 0o600); err != nil {
		t.Fatal(err)
	}
	nodeConfig := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(nodeConfig, []byte(`apiVersion: carve.dev/v1alpha1
kind: NodeConfig
netdev:
  pools:
  - name: tenant-a
    cidr: 10.80.0.0/24
  - name: tenant-b
    cidr: fd00:80::/64
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		sets []string
		want []string // nil: the class carries no config
	}{
		{"no node config", nil, nil},
		{"the node config's one pool", []string{"--set-file=nodeConfig=" + onePool}, []string{"tenant-a"}},
		{"several pools, none chosen", []string{"--set-file=nodeConfig=" + nodeConfig}, nil},
		{"a list", []string{"--set-file=nodeConfig=" + nodeConfig, `--set-json=nicClassAllowedPools=["tenant-b"]`}, []string{"tenant-b"}},
		{"none", []string{"--set-file=nodeConfig=" + nodeConfig, `--set-json=nicClassAllowedPools=[]`}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var class map[string]any
			rendered := renderChart(t, c.sets...)
			says := strings.Contains(string(rendered), "# No address pool for this class's claims: the node config has more than\n  # one, and nicClassAllowedPools does not say which")
			if want := c.name == "several pools, none chosen"; says != want {
				t.Errorf("the rendering says the class has no pool because the node config has several: %v, want %v", says, want)
			}
			for _, o := range decodeObjects(t, rendered) {
				if o.GetKind() == "DeviceClass" && o.GetName() == "nic.carve.dev" {
					class = o.Object
				}
			}
			if class == nil {
				t.Fatal("no nic.carve.dev DeviceClass rendered")
			}
			configs, _ := class["spec"].(map[string]any)["config"].([]any)
			if c.want == nil {
				if len(configs) != 0 {
					t.Fatalf("config %v, want none", configs)
				}
				return
			}
			if len(configs) != 1 {
				t.Fatalf("config %v, want one NetworkConfig", configs)
			}
			opaque := configs[0].(map[string]any)["opaque"].(map[string]any)
			raw, err := json.Marshal(opaque["parameters"])
			if err != nil {
				t.Fatal(err)
			}
			obj, err := v1alpha1.Decode(raw, field.NewPath("parameters"))
			if err != nil {
				t.Fatalf("the agent refuses the class's config %s: %v", raw, err)
			}
			n, ok := obj.(*v1alpha1.NetworkConfig)
			if !ok || opaque["driver"] != "carve.dev" || !reflect.DeepEqual(n.AllowedPools, c.want) || len(n.Pools) != 0 {
				t.Fatalf("class config %s for driver %v: want allowedPools %v only", raw, opaque["driver"], c.want)
			}
		})
	}
}

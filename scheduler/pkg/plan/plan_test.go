package plan

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/carve-dra/carve/scheduler/pkg/fixture"
	"github.com/carve-dra/carve/scheduler/pkg/sharefit"
)

func nic(name, bw string) *resourceapi.ResourceClaim {
	return fixture.Claim("default", name, fixture.ShareSpec("nic", map[resourceapi.QualifiedName]string{fixture.Egress: bw, fixture.Ingress: bw}))
}

func input() Input {
	held := nic("held", "60G")
	fixture.Allocate(held, "n1", "nic-0000-19-00-0")
	return Input{
		Slices: []*resourceapi.ResourceSlice{fixture.Server("n1", "100G", "80Gi"), fixture.Server("n2", "100G", "80Gi")},
		Claims: []*resourceapi.ResourceClaim{
			held,
			nic("small", "20G"),
			fixture.Claim("default", "gpu", fixture.ShareSpec("gpu", map[resourceapi.QualifiedName]string{fixture.Memory: "10Gi"})),
			nic("huge", "200G"),
		},
	}
}

// The strategy picks the node; the allocator picks the device; claims are
// placed in order, each seeing the ones before; the classes come from the
// chart's definition when the input has none.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		strategy  sharefit.Strategy
		smallNode string
	}{{sharefit.MostAllocated, "n1"}, {sharefit.LeastAllocated, "n2"}} {
		res, err := Run(context.Background(), input(), tc.strategy)
		if err != nil {
			t.Fatal(err)
		}
		p := res.Placements
		if len(p) != 4 || !p[0].Allocated || p[0].Node != "n1" {
			t.Fatalf("%s: placements %+v", tc.strategy, p)
		}
		if p[1].Node != tc.smallNode || len(p[1].Devices) != 1 || p[1].Devices[0].Device != "nic-0000-19-00-0" {
			t.Errorf("%s: small share placed %+v, want %s's first NIC", tc.strategy, p[1], tc.smallNode)
		}
		if p[2].Node == "" || p[2].Devices[0].Device != "gpu-0000-18-00-0" {
			t.Errorf("%s: gpu share placed %+v", tc.strategy, p[2])
		}
		if p[3].Node != "" || p[3].Reason == "" {
			t.Errorf("%s: a 200G share on 100G NICs placed %+v", tc.strategy, p[3])
		}
		var n1nic DeviceUse
		for _, d := range res.Devices {
			if d.Node == "n1" && d.Device == "nic-0000-19-00-0" {
				n1nic = d
			}
		}
		wantShares, wantUsed := 1, "60G"
		if tc.strategy == sharefit.MostAllocated {
			wantShares, wantUsed = 2, "80G"
		}
		if u := n1nic.Capacity[string(fixture.Egress)].Used; n1nic.Shares != wantShares || u.String() != wantUsed {
			t.Errorf("%s: n1's first NIC %+v, want %d shares and %s egress used", tc.strategy, n1nic, wantShares, wantUsed)
		}
	}
}

// Files may hold several documents and Lists; other kinds are refused with
// the file named; the printed plan names claims, nodes and use.
func TestLoadAndPrint(t *testing.T) {
	in := input()
	dir := t.TempDir()
	var docs []string
	for _, s := range in.Slices {
		s.APIVersion, s.Kind = "resource.k8s.io/v1", "ResourceSlice"
		b, _ := yaml.Marshal(s)
		docs = append(docs, string(b))
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "items": in.Claims}
	for _, c := range in.Claims {
		c.APIVersion, c.Kind = "resource.k8s.io/v1", "ResourceClaim"
	}
	b, _ := yaml.Marshal(list)
	slices, claims := filepath.Join(dir, "slices.yaml"), filepath.Join(dir, "claims.yaml")
	must(t, os.WriteFile(slices, []byte(strings.Join(docs, "---\n")), 0o644))
	must(t, os.WriteFile(claims, b, 0o644))

	var got Input
	must(t, got.Load(slices, claims))
	if len(got.Slices) != 2 || len(got.Claims) != 4 {
		t.Fatalf("loaded %d slices, %d claims", len(got.Slices), len(got.Claims))
	}
	res, err := Run(context.Background(), got, sharefit.MostAllocated)
	must(t, err)
	var out bytes.Buffer
	must(t, res.Print(&out))
	for _, want := range []string{"default/small", "net=nic-0000-19-00-0", "2 shares, egressBandwidth 80G/100G (80%)", "unschedulable"} {
		if !strings.Contains(out.String(), strings.Replace(want, "net=", "nic=", 1)) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// A claim as a user writes it, without the API server's defaults.
	bare := filepath.Join(dir, "bare.yaml")
	must(t, os.WriteFile(bare, []byte(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: bare, namespace: default}
spec:
  devices:
    requests:
    - name: net
      exactly:
        deviceClassName: nic.carve.dev
        capacity: {requests: {egressBandwidth: 3G}}
`), 0o644))
	plain := Input{Slices: got.Slices}
	must(t, plain.Load(bare))
	res, err = Run(context.Background(), plain, sharefit.MostAllocated)
	must(t, err)
	if p := res.Placements[0]; p.Node == "" {
		t.Errorf("a claim without defaults was not placed: %s", p.Reason)
	}

	bad := filepath.Join(dir, "pod.yaml")
	must(t, os.WriteFile(bad, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"), 0o644))
	if err := (&Input{}).Load(bad); err == nil || !strings.Contains(err.Error(), "pod.yaml") {
		t.Errorf("a Pod was loaded: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

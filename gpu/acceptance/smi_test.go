package acceptance

import (
	"os"
	"testing"
)

// The -lgipp and -lgip texts in testdata follow the layout of NVIDIA's MIG
// user guide, filled with the H100's profile Ids and placements as NVML
// reported them on the card (results/h100-580-nvmlrecord.json): the lent
// machine ran with MIG off, so no nvidia-smi MIG listing was recorded.
func TestParseLGIPP(t *testing.T) {
	raw, err := os.ReadFile("testdata/h100-lgipp.txt")
	if err != nil {
		t.Fatal(err)
	}
	pls, err := ParseLGIPP(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := recordedPlacements(t)
	if len(pls) != len(want) {
		t.Fatalf("%d placements read, the card reported %d", len(pls), len(want))
	}
	have := map[SMIPlacement]bool{}
	for _, p := range pls {
		have[p] = true
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("placement %+v not read", w)
		}
	}
	for _, bad := range []string{"", "GPU 0 Profile ID x Placements: {0}:1", "GPU  0 Profile ID 19 Placements: {0,a}:1", "No MIG-enabled devices found."} {
		if _, err := ParseLGIPP(bad); err == nil {
			t.Errorf("%q read without an error", bad)
		}
	}
}

func TestParseLGIP(t *testing.T) {
	raw, err := os.ReadFile("testdata/h100-lgip.txt")
	if err != nil {
		t.Fatal(err)
	}
	names, err := ParseLGIP(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(names[0]) != len(h100Names) {
		t.Fatalf("names %v, want %v", names[0], h100Names)
	}
	for id, n := range h100Names {
		if names[0][id] != n {
			t.Errorf("profile Id %d: %q, want %q", id, names[0][id], n)
		}
	}
	if _, err := ParseLGIP("No MIG-enabled devices found."); err == nil {
		t.Error("no table read without an error")
	}
}

func TestParseSMIQuery(t *testing.T) {
	gpus, err := ParseSMIQuery("0, GPU-a, 00000000:00:06.0, 81559\n1, GPU-b, 00000000:00:07.0, 81559\n")
	if err != nil || len(gpus) != 2 || gpus[1] != (SMIGPU{Index: 1, UUID: "GPU-b", BusID: "00000000:00:07.0", MemoryMiB: 81559}) {
		t.Fatalf("%+v %v", gpus, err)
	}
	for _, bad := range []string{"", "0, GPU-a, 00000000:00:06.0", "0, GPU-a, 00000000:00:06.0, [N/A]", "x, GPU-a, b, 1"} {
		if _, err := ParseSMIQuery(bad); err == nil {
			t.Errorf("%q read without an error", bad)
		}
	}
}

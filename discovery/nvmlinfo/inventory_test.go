package nvmlinfo

import (
	"strings"
	"testing"
)

const example = `{"driverVersion": "580.159.04", "cudaDriverVersion": 13000,
 "devices": [{"index": 0, "minor": 0, "uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3",
              "pciBusId": "00000000:19:00.0", "memoryTotalBytes": 85520809984, "architecture": "hopper",
              "computeCapability": "9.0", "migCapable": true, "migEnabled": false,
              "migProfiles": [{"profileId": 9, "name": "3g.40gb", "sliceCount": 3, "instanceCount": 2,
                               "memorySizeMB": 40448, "multiprocessorCount": 60,
                               "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]}]}]}`

func TestDecodeIssueExample(t *testing.T) {
	inv, err := Decode(strings.NewReader(example))
	if err != nil {
		t.Fatal(err)
	}
	d := inv.Devices[0]
	if d.UUID != "GPU-a" || d.MemoryTotalBytes != 85520809984 || d.MIGProfiles[0].Placements[1] != (Placement{4, 4}) || inv.CUDADriverVersion != 13000 {
		t.Fatalf("decoded %+v", inv)
	}
	if d.MemorySlices() != 8 {
		t.Errorf("memory slices = %d, want 8", d.MemorySlices())
	}
}

func TestDecodeRejects(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"unknown top key":    {strings.Replace(example, `"driverVersion"`, `"driverVer": "x", "driverVersion"`, 1), `unknown field "driverVer"`},
		"unknown device key": {strings.Replace(example, `"minor": 0`, `"minor": 0, "serial": "1"`, 1), `unknown field "serial"`},
		"unknown profile":    {strings.Replace(example, `"sliceCount": 3`, `"sliceCount": 3, "slices": 3`, 1), `unknown field "slices"`},
		"bad bus id":         {strings.Replace(example, `00000000:19:00.0`, `19:00`, 1), "devices[0].pciBusId"},
		"bad capability":     {strings.Replace(example, `"9.0"`, `"nine"`, 1), "computeCapability"},
		"placement too far":  {strings.Replace(example, `{"start": 4, "size": 4}`, `{"start": 28, "size": 4}`, 1), "placements[1]"},
		"trailing":           {example + "{}", "data after"},
		"duplicate uuid":     {strings.TrimSuffix(example, "]}") + `, {"index": 1, "minor": 1, "uuid": "GPU-a"}]}`, "duplicate uuid GPU-a"},
		"mig without cap":    {strings.Replace(example, `"migCapable": true, "migEnabled": false`, `"migCapable": false, "migEnabled": true`, 1), "migEnabled without migCapable"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:19:00.0": "0000:19:00.0",
		"00000000:1A:00.0": "0000:1a:00.0",
		"0000:3b:00.1":     "0000:3b:00.1",
		"00010000:01:00.0": "",
		"19:00.0":          "",
	} {
		got, err := NormalizeBusID(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("NormalizeBusID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// The real H100 with driver 580: spans count memory slices, 8 in all.
func TestMaxDisjoint(t *testing.T) {
	d := Device{MIGProfiles: []MIGProfile{
		{Name: "1g.10gb", MultiprocessorCount: 16, Placements: []Placement{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}}},
		{Name: "1g.20gb", MultiprocessorCount: 16, Placements: []Placement{{0, 2}, {2, 2}, {4, 2}, {6, 2}}},
		{Name: "3g.40gb", MultiprocessorCount: 60, Placements: []Placement{{0, 4}, {4, 4}}},
		{Name: "7g.80gb", MultiprocessorCount: 132, Placements: []Placement{{0, 8}}},
	}}
	mp := func(p MIGProfile) uint64 { return uint64(p.MultiprocessorCount) }
	if got := d.MaxDisjoint(mp); got != 132 {
		t.Errorf("max disjoint multiprocessors = %d, want 132 (7g alone beats 3g+3g=120 and 7x1g=112)", got)
	}
	d.MIGProfiles[2].MultiprocessorCount = 70
	if got := d.MaxDisjoint(mp); got != 140 {
		t.Errorf("max disjoint multiprocessors = %d, want 140 (3g at 0 and 4)", got)
	}
	if !(Placement{0, 4}).Overlaps(Placement{2, 2}) || (Placement{0, 4}).Overlaps(Placement{4, 4}) {
		t.Error("overlap wrong")
	}
}

// A profile without profileIndex (files written before carve recorded it)
// decodes as NoProfileIndex, never as index 0, which is 1_SLICE.
func TestDecodeProfileIndex(t *testing.T) {
	inv, err := Decode(strings.NewReader(example))
	if err != nil {
		t.Fatal(err)
	}
	if got := inv.Devices[0].MIGProfiles[0].ProfileIndex; got != NoProfileIndex {
		t.Errorf("absent profileIndex decoded as %d", got)
	}
	inv, err = Decode(strings.NewReader(strings.Replace(example, `"profileId": 9`, `"profileIndex": 0, "profileId": 9`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := inv.Devices[0].MIGProfiles[0].ProfileIndex; got != 0 {
		t.Errorf("profileIndex 0 decoded as %d", got)
	}
	if _, err := Decode(strings.NewReader(strings.Replace(example, `"profileId": 9`, `"profileIndex": -2, "profileId": 9`, 1))); err == nil {
		t.Error("a negative profileIndex decoded")
	}
}

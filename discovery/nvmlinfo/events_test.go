package nvmlinfo_test

import (
	"strings"
	"testing"

	"github.com/carve-dra/carve/discovery/nvmlinfo"
)

func TestDecodeEvents(t *testing.T) {
	const dev = `"devices":[{"index":0,"minor":0,"uuid":"GPU-a","name":"x","pciBusId":"00000000:19:00.0","memoryTotalBytes":1,"architecture":"hopper","computeCapability":"9.0","migCapable":false,"migEnabled":false}]`
	inv, err := nvmlinfo.Decode(strings.NewReader(`{"driverVersion":"580","cudaDriverVersion":13000,` + dev +
		`,"events":[{"afterMs":500,"uuid":"GPU-a","type":"xid","xid":79},{"afterMs":900,"uuid":"GPU-a","type":"gpuLost"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Events) != 2 || inv.Events[0].XID != 79 || inv.Events[1].Type != nvmlinfo.EventGPULost {
		t.Fatalf("events %+v", inv.Events)
	}
	// A file without events, as carve snapshot writes, still decodes.
	if _, err := nvmlinfo.Decode(strings.NewReader(`{"driverVersion":"580","cudaDriverVersion":13000,` + dev + `}`)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		`{"afterMs":1,"uuid":"GPU-b","type":"xid","xid":79}`,
		`{"afterMs":1,"uuid":"GPU-a","type":"xid"}`,
		`{"afterMs":1,"uuid":"GPU-a","type":"gpuLost","xid":3}`,
		`{"afterMs":-1,"uuid":"GPU-a","type":"gpuLost"}`,
		`{"afterMs":1,"uuid":"GPU-a","type":"melted"}`,
	} {
		if _, err := nvmlinfo.Decode(strings.NewReader(`{"driverVersion":"580","cudaDriverVersion":13000,` + dev + `,"events":[` + bad + `]}`)); err == nil {
			t.Errorf("event %s accepted", bad)
		}
	}
}

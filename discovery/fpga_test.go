package discovery_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

// An XRT card is one device with the nodes of both its functions; a DFL
// card gives its FME and port, not the flash below the FME, and says what
// is loaded.
func TestFPGACards(t *testing.T) {
	tree := sysfstest.Typical(t.TempDir())
	inv := discover(t, tree.Root, discovery.NetFilter{})
	if len(inv.FPGAs) != 2 {
		t.Fatalf("FPGAs = %+v, want the XRT card and the DFL card", inv.FPGAs)
	}
	x := inv.FPGAs[0]
	if x.Address != "0000:3b:00.0" || !reflect.DeepEqual(x.Functions, []string{"0000:3b:00.0", "0000:3b:00.1"}) {
		t.Errorf("XRT card = %s with functions %v, want the management function first, then the user function", x.Address, x.Functions)
	}
	if want := []string{"/dev/dri/card1", "/dev/dri/renderD128", "/dev/xclmgmt15104", "/dev/xfpga/flash.m15104.0"}; !reflect.DeepEqual(x.DevNodes, want) {
		t.Errorf("XRT nodes = %v, want %v", x.DevNodes, want)
	}
	if x.CompatID != "" || x.AFUID != "" {
		t.Errorf("XRT ids = %q, %q; sysfs has none", x.CompatID, x.AFUID)
	}
	d := inv.FPGAs[1]
	if want := []string{"/dev/dfl-fme.0", "/dev/dfl-port.0"}; !reflect.DeepEqual(d.DevNodes, want) {
		t.Errorf("DFL nodes = %v, want %v (not the FME's flash)", d.DevNodes, want)
	}
	if d.CompatID != sysfstest.TypicalCompatID || d.AFUID != sysfstest.TypicalAFUID {
		t.Errorf("DFL ids = %q, %q; want %q, %q", d.CompatID, d.AFUID, sysfstest.TypicalCompatID, sysfstest.TypicalAFUID)
	}
}

// Two cards are two devices even on one bus; a malformed id is left out
// rather than published.
func TestFPGACardsApart(t *testing.T) {
	tree := sysfstest.New(t.TempDir())
	tree.AddXRT(sysfstest.XRT{Mgmt: "0000:af:00.0", User: "0000:af:00.1", Instance: 44800, Render: 129})
	tree.AddXRT(sysfstest.XRT{Mgmt: "0000:af:01.0", User: "0000:af:01.1", Instance: 44808, Render: 130})
	tree.AddDFL(sysfstest.DFL{Address: "0000:d8:00.0", ID: 1, CompatID: "not-an-id", AFUID: "0x" + sysfstest.TypicalAFUID})
	inv := discover(t, tree.Root, discovery.NetFilter{})
	if len(inv.FPGAs) != 3 {
		t.Fatalf("FPGAs = %+v, want three cards", inv.FPGAs)
	}
	if a, b := inv.FPGAs[0], inv.FPGAs[1]; len(a.Functions) != 2 || len(b.Functions) != 2 || a.DevNodes[2] != "/dev/xclmgmt44800" || b.DevNodes[2] != "/dev/xclmgmt44808" {
		t.Errorf("XRT cards = %+v / %+v", a, b)
	}
	if d := inv.FPGAs[2]; d.CompatID != "" || d.AFUID != sysfstest.TypicalAFUID {
		t.Errorf("DFL ids = %q, %q; want the malformed compat_id left out, the afu_id without 0x", d.CompatID, d.AFUID)
	}
}

// FPGARoot replaces the root for FPGA cards only.
func TestFPGARootOverlay(t *testing.T) {
	host := sysfstest.Typical(t.TempDir())
	fixture := sysfstest.New(t.TempDir())
	fixture.AddDFL(sysfstest.DFL{Address: "0000:d8:00.0", ID: 3, AFUID: sysfstest.TypicalAFUID})
	inv, err := discovery.Discover(context.Background(), discovery.Options{Root: host.Root, FPGARoot: fixture.Root})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.FPGAs) != 1 || inv.FPGAs[0].Address != "0000:d8:00.0" || len(inv.NICs) == 0 || len(inv.GPUs) != 1 {
		t.Errorf("FPGAs %+v, %d NICs, %d GPUs: want only the fixture's card, the rest from the host root", inv.FPGAs, len(inv.NICs), len(inv.GPUs))
	}
}

package resctrl_test

import (
	"reflect"
	"testing"

	"github.com/carve-dra/carve/prepare/llc/resctrl"
)

func TestParseSchemata(t *testing.T) {
	s, err := resctrl.ParseSchemata("    L3:0=000ff;1=fff00\n    MB:0=100;1=30\n")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.Mask(1); err != nil || m != 0xfff00 {
		t.Errorf("mask 1 = %x, %v", m, err)
	}
	if !reflect.DeepEqual(s["MB"], map[int]string{0: "100", 1: "30"}) {
		t.Errorf("MB = %v", s["MB"])
	}
	if _, err := s.Mask(2); err == nil {
		t.Errorf("mask of an unknown domain: no error")
	}
	for _, bad := range []string{"L3", "L3:x=ff", "L3:0", "L3:-1=f"} {
		if _, err := resctrl.ParseSchemata(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if got := resctrl.L3Line(map[int]uint64{1: 0xf0, 0: 0xff00}); got != "L3:0=ff00;1=f0" {
		t.Errorf("L3Line = %q", got)
	}
}

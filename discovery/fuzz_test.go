package discovery_test

import (
	"reflect"
	"testing"

	"github.com/carve-dra/carve/discovery"
)

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3,8,10-11", "0", "", "3-1", "0-65535", "1,1,1", "a-b", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := discovery.ParseCPUList(s)
		if err != nil {
			return
		}
		again, err := discovery.ParseCPUList(discovery.FormatCPUList(cpus))
		if err != nil || !reflect.DeepEqual(again, cpus) {
			t.Fatalf("round trip of %q: %v then %v (%v)", s, cpus, again, err)
		}
	})
}

func FuzzParseCacheSize(f *testing.F) {
	for _, s := range []string{"48K", "260M", "1G", "0", "K", "-1K", "99999999999999999999M"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := discovery.ParseCacheSize(s); err == nil && n < 0 {
			t.Fatalf("%q parsed to negative %d", s, n)
		}
	})
}

func FuzzParseHexMask(f *testing.F) {
	for _, s := range []string{"fffff", "0x7ff", "", "g", "ffffffffffffffffff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if m, err := discovery.ParseHexMask(s); err == nil && discovery.MaskWays(m) > 64 {
			t.Fatalf("%q: %d ways", s, discovery.MaskWays(m))
		}
	})
}

func FuzzParseKernelConfig(f *testing.F) {
	for _, s := range []string{"CONFIG_A=y\n# CONFIG_B is not set\n", "junk", "CONFIG_=", "\n\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		opts, err := discovery.ParseKernelConfig(s)
		if err == nil && opts == nil {
			t.Fatalf("nil options without error")
		}
	})
}

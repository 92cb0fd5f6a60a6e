package discovery_test

import (
	"context"
	"testing"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

// BenchmarkDiscoverLarge discovers the benchmark node: 8 GPUs, 16 NICs with
// 128 VFs each (2064 netdevs), 2 LLCs and 4 FPGAs.
func BenchmarkDiscoverLarge(b *testing.B) {
	root := sysfstest.Large(b.TempDir()).Root
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		inv, err := discovery.Discover(ctx, discovery.Options{Root: root})
		if err != nil {
			b.Fatal(err)
		}
		if len(inv.NICs) != 2064 || len(inv.GPUs) != 8 || len(inv.FPGAs) != 4 || len(inv.LLCs) != 2 {
			b.Fatalf("large node: %d NICs, %d GPUs, %d FPGAs, %d LLCs", len(inv.NICs), len(inv.GPUs), len(inv.FPGAs), len(inv.LLCs))
		}
	}
}

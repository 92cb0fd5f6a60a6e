package discovery_test

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/carve-dra/carve/discovery"
	"github.com/carve-dra/carve/discovery/sysfstest"
)

// BenchmarkDiscoverLarge discovers the benchmark node: 8 GPUs, 16 NICs with
// 128 VFs each (2064 netdevs), 2 LLCs and 4 FPGAs.
//   - cold: the first discovery of a process (carve discover, the agent's
//     start): every PCI function and netdev read, pci.ids read for names.
//     Nothing is kept between runs (each is a new Scanner), as in a new
//     process.
//   - rescan: the agent's periodic rescan with nothing changed: every
//     netdev read again, the PCI functions checked.
//   - link-event: a rescan after a netlink event of one VF with nothing
//     changed: that netdev read again, the rest checked.
//   - vf-count-change: a rescan after the last VF of a PF was disabled or
//     enabled again (alternately; the change itself is not timed), with the
//     event of that VF's netdev: the PCI functions changed, but the last
//     read of pci.ids named the VF's IDs.
//   - new-device-ids: a rescan after a function whose IDs the last read
//     of pci.ids did not name replaced another (not timed): pci.ids read
//     again.
func BenchmarkDiscoverLarge(b *testing.B) {
	tree := sysfstest.Large(b.TempDir())
	ctx := context.Background()
	opts := discovery.Options{Root: tree.Root}
	check := func(b *testing.B, inv *discovery.Inventory, err error, nics int) {
		if err != nil {
			b.Fatal(err)
		}
		if len(inv.NICs) != nics || len(inv.GPUs) != 8 || len(inv.FPGAs) != 4 || len(inv.LLCs) != 2 {
			b.Fatalf("large node: %d NICs (want %d), %d GPUs, %d FPGAs, %d LLCs", len(inv.NICs), nics, len(inv.GPUs), len(inv.FPGAs), len(inv.LLCs))
		}
	}
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		var cpu cpuTime
		for b.Loop() {
			cpu.start()
			inv, err := discovery.Discover(ctx, opts)
			cpu.stop()
			check(b, inv, err, 2064)
		}
		cpu.report(b)
	})
	warm := func(b *testing.B) *discovery.Scanner {
		s := discovery.NewScanner(opts)
		inv, err := s.Scan(ctx, discovery.AnyChange())
		check(b, inv, err, 2064)
		b.ReportAllocs()
		return s
	}
	b.Run("rescan", func(b *testing.B) {
		s := warm(b)
		var cpu cpuTime
		for b.Loop() {
			cpu.start()
			inv, err := s.Scan(ctx, discovery.AnyChange())
			cpu.stop()
			check(b, inv, err, 2064)
		}
		cpu.report(b)
	})
	b.Run("link-event", func(b *testing.B) {
		s := warm(b)
		var cpu cpuTime
		for b.Loop() {
			cpu.start()
			inv, err := s.Scan(ctx, discovery.LinksChanged("ens3f0v7"))
			cpu.stop()
			check(b, inv, err, 2064)
		}
		cpu.report(b)
	})
	b.Run("vf-count-change", func(b *testing.B) {
		s := warm(b)
		const pf, vf, vfNet = "0000:9e:00.0", "0000:9e:10.0", "ens15f0v127"
		enabled := true
		var cpu cpuTime
		defer func() {
			if !enabled {
				enableLastVF(tree, pf, vf, vfNet)
			}
		}()
		for b.Loop() {
			b.StopTimer()
			if enabled {
				tree.RemovePCI(vf)
				tree.Write(filepath.Join(tree.PCIDir(pf), "sriov_numvfs"), "127")
			} else {
				enableLastVF(tree, pf, vf, vfNet)
			}
			enabled = !enabled
			want := 2063
			if enabled {
				want = 2064
			}
			b.StartTimer()
			cpu.start()
			inv, err := s.Scan(ctx, discovery.LinksChanged(vfNet))
			cpu.stop()
			check(b, inv, err, want)
		}
		cpu.report(b)
	})
	b.Run("new-device-ids", func(b *testing.B) {
		s := warm(b)
		// Two addresses in turn: a function made again at once at the
		// same address may get its inode back on this file system, never
		// in sysfs.
		addr := func(i int) string { return fmt.Sprintf("0000:c0:00.%d", i%2) }
		var cpu cpuTime
		i := 0
		defer func() {
			if i > 0 {
				tree.RemovePCI(addr(i - 1))
			}
		}()
		for ; b.Loop(); i++ {
			// Each time a device ID no read of pci.ids named yet.
			b.StopTimer()
			if i > 0 {
				tree.RemovePCI(addr(i - 1))
			}
			tree.AddPCI(addr(i), sysfstest.PCI{Vendor: 0x144d, Device: uint16(0x1000 + i), Class: 0x010802, NUMANode: 0, Driver: "nvme"})
			b.StartTimer()
			cpu.start()
			inv, err := s.Scan(ctx, discovery.LinksChanged())
			cpu.stop()
			check(b, inv, err, 2064)
		}
		cpu.report(b)
	})
}

// cpuTime adds up the CPU time (user and system, all threads) this process
// spends in the timed part of a benchmark. Other engineers share this
// machine's cores: wall time grows with their load, CPU time much less.
type cpuTime struct {
	total time.Duration
	n     int
	at    time.Duration
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (c *cpuTime) start() { c.at = processCPU() }
func (c *cpuTime) stop()  { c.total += processCPU() - c.at; c.n++ }

// report adds cpu-ns/op to the benchmark's line.
func (c *cpuTime) report(b *testing.B) {
	if c.n > 0 {
		b.ReportMetric(float64(c.total.Nanoseconds())/float64(c.n), "cpu-ns/op")
	}
}

// enableLastVF adds back the VF the vf-count-change benchmark disables, as
// sysfstest.Large made it.
func enableLastVF(tree *sysfstest.Tree, pf, vf, vfNet string) {
	tree.AddVF(pf, vf, 127, sysfstest.PCI{Vendor: sysfstest.VendorMellanox, Device: sysfstest.DeviceCX6DxVF, Class: sysfstest.ClassEthernet, NUMANode: 1, Driver: "mlx5_core"})
	tree.AddNIC(vfNet, sysfstest.NIC{PCIAddress: vf, MAC: fmt.Sprintf("b8:ce:f6:%02x:%02x:%02x", 15, 1, 127), MTU: 9000, Speed: 100000, Carrier: 1})
	tree.Write(filepath.Join(tree.PCIDir(pf), "sriov_numvfs"), "128")
}

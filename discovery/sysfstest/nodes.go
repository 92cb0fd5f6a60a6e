package sysfstest

import "fmt"

// PCI class codes and vendors the fixtures use.
const (
	ClassEthernet    = 0x020000
	Class3DGPU       = 0x030200
	ClassProcAccel   = 0x120000
	ClassPCIBridge   = 0x060400
	VendorMellanox   = 0x15b3
	VendorIntel      = 0x8086
	VendorNVIDIA     = 0x10de
	VendorXilinx     = 0x10ee
	VendorRedHat     = 0x1af4
	DeviceH100       = 0x2330
	DeviceCX6Dx      = 0x101d
	DeviceCX6DxVF    = 0x101e
	DeviceAlveoU250  = 0x5004
	DeviceIntelN3000 = 0x0b30
)

// The ids of what the typical node's DFL card has loaded.
const (
	TypicalCompatID = "f3c99413524552c59ce3a6e29fa8c41e"
	TypicalAFUID    = "d8424dc4a4a3c413f89e433683f9040b"
)

// Typical builds a small but varied node: a 25G PF with SR-IOV behind a
// bridge, a second port whose link is down, a virtio NIC of unknown speed, a
// veth, two L3 caches with resctrl, an XRT and an Intel DFL FPGA (with the
// /dev nodes udev would have made), and an
// NVIDIA GPU, on a kernel that can enforce bandwidth shares.
func Typical(dir string) *Tree {
	t := New(dir)
	t.AddPCI("0000:16:00.0", PCI{Vendor: VendorIntel, Device: 0x347a, Class: ClassPCIBridge, NUMANode: 0})
	t.AddPCI("0000:17:00.0", PCI{Vendor: VendorMellanox, Device: DeviceCX6Dx, Class: ClassEthernet, NUMANode: 0, Driver: "mlx5_core", Parent: "0000:16:00.0"})
	t.AddNIC("ens1f0np0", NIC{PCIAddress: "0000:17:00.0", MAC: "b8:ce:f6:00:00:01", MTU: 9000, Speed: 25000, Carrier: 1, TotalVFs: 8, NumVFs: 2})
	t.AddPCI("0000:17:00.1", PCI{Vendor: VendorMellanox, Device: DeviceCX6Dx, Class: ClassEthernet, NUMANode: 0, Driver: "mlx5_core", Parent: "0000:16:00.0"})
	t.AddNIC("ens1f1np1", NIC{PCIAddress: "0000:17:00.1", MAC: "b8:ce:f6:00:00:02", MTU: 1500, Speed: -1, OperState: "down", Carrier: 0})
	t.AddPCI("0000:00:03.0", PCI{Vendor: VendorRedHat, Device: 0x1041, Class: ClassEthernet, NUMANode: -1, Driver: "virtio-pci"})
	t.AddNIC("eth0", NIC{PCIAddress: "0000:00:03.0", MAC: "02:fc:00:00:00:01", MTU: 1400, Speed: -1, Carrier: 1})
	t.AddNIC("veth0", NIC{MAC: "2e:aa:bb:cc:dd:ee", MTU: 1500, Speed: 10000, Carrier: 1})
	t.AddNIC("lo", NIC{MAC: "00:00:00:00:00:00", MTU: 65536, Speed: -1, OperState: "unknown", Carrier: 1})

	t.AddLLC(LLC{ID: 0, CPUs: cpus(0, 16), Size: "32768K", Ways: 16})
	t.AddLLC(LLC{ID: 1, CPUs: cpus(16, 16), Size: "32768K", Ways: 16})
	t.AddResctrl("ffff", 1, 16)
	t.AddMBA(10, 10)

	t.AddXRT(XRT{Mgmt: "0000:3b:00.0", User: "0000:3b:00.1", Instance: 15104, Render: 128, NUMANode: 1})
	t.AddDFL(DFL{Address: "0000:5e:00.0", ID: 0, NUMANode: 1, CompatID: TypicalCompatID, AFUID: TypicalAFUID})

	t.AddPCI("0000:c1:00.0", PCI{Vendor: VendorNVIDIA, Device: DeviceH100, Class: Class3DGPU, NUMANode: 1, Driver: "nvidia"})
	t.SetKernelConfig(EnforcingKernel...)
	t.Write("proc/sys/kernel/osrelease", "6.18.0-test")
	return t
}

// Large builds the benchmark node: 8 GPUs, 16 NICs each with 128 VFs (every
// VF with its own netdev), 2 LLCs of 64 CPUs and 4 FPGAs.
func Large(dir string) *Tree {
	t := New(dir)
	for g := 0; g < 8; g++ {
		t.AddPCI(fmt.Sprintf("0000:%02x:00.0", 0x18+g*8), PCI{Vendor: VendorNVIDIA, Device: DeviceH100, Class: Class3DGPU, NUMANode: g / 4, Driver: "nvidia"})
	}
	for n := 0; n < 16; n++ {
		bus := 0x80 + n*2
		pf := fmt.Sprintf("0000:%02x:00.0", bus)
		t.AddPCI(pf, PCI{Vendor: VendorMellanox, Device: DeviceCX6Dx, Class: ClassEthernet, NUMANode: n / 8, Driver: "mlx5_core"})
		t.AddNIC(fmt.Sprintf("ens%df0", n), NIC{PCIAddress: pf, MAC: fmt.Sprintf("b8:ce:f6:%02x:00:00", n), MTU: 9000, Speed: 100000, Carrier: 1, TotalVFs: 128, NumVFs: 128})
		for v := 0; v < 128; v++ {
			fn := v + 1
			vf := fmt.Sprintf("0000:%02x:%02x.%d", bus+fn/256, (fn%256)/8, fn%8)
			t.AddVF(pf, vf, v, PCI{Vendor: VendorMellanox, Device: DeviceCX6DxVF, Class: ClassEthernet, NUMANode: n / 8, Driver: "mlx5_core"})
			t.AddNIC(fmt.Sprintf("ens%df0v%d", n, v), NIC{PCIAddress: vf, MAC: fmt.Sprintf("b8:ce:f6:%02x:%02x:%02x", n, 1+v/256, v%256), MTU: 9000, Speed: 100000, Carrier: 1})
		}
	}
	t.AddLLC(LLC{ID: 0, CPUs: cpus(0, 64), Size: "131072K", Ways: 16})
	t.AddLLC(LLC{ID: 1, CPUs: cpus(64, 64), Size: "131072K", Ways: 16})
	t.AddResctrl("ffff", 1, 16)
	for f := 0; f < 4; f++ {
		addr := fmt.Sprintf("0000:%02x:00.0", 0xd0+f)
		t.AddPCI(addr, PCI{Vendor: VendorXilinx, Device: DeviceAlveoU250, Class: ClassProcAccel, NUMANode: f / 2, Driver: "xclmgmt"})
		t.AddDevNode(addr, "xclmgmt/xclmgmt", fmt.Sprintf("xclmgmt%d", f))
	}
	t.SetKernelConfig(EnforcingKernel...)
	return t
}

func cpus(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

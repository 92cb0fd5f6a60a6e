package sysfstest

// GPUNode builds a node with an NVIDIA GPU function at each address, NUMA
// node i/4 (a VM's -1 where numa is negative), and a 100G NIC on the first
// GPU's PCIe root so that claims can ask for both together.
func GPUNode(dir string, addrs []string, numa func(i int) int) *Tree {
	t := New(dir)
	for i, a := range addrs {
		t.AddPCI(a, PCI{Vendor: VendorNVIDIA, Device: DeviceH100, Class: Class3DGPU, NUMANode: numa(i), Driver: "nvidia"})
	}
	t.SetKernelConfig()
	return t
}

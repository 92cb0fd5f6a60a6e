package v1alpha1

// DefaultInterfaceName is the name of a share's interface in the pod when
// the config names none.
const DefaultInterfaceName = "net1"

// SetDefaultsDeviceConfig fills in the defaults of a DeviceConfig (it has
// none today; registered so that every kind is defaulted the same way).
func SetDefaultsDeviceConfig(*DeviceConfig) {}

// SetDefaultsGPUConfig fills in the defaults of a GPUConfig: none (an unset
// sharedMemorySize is the agent's --mps-shm-size, which only the agent knows).
func SetDefaultsGPUConfig(*GPUConfig) {}

// SetDefaultsNetworkConfig fills in the interface kind, its mode and its
// name where the config leaves them out.
func SetDefaultsNetworkConfig(c *NetworkConfig) {
	if c.Mode == "" {
		c.Mode = "macvlan"
	}
	switch c.Mode {
	case "macvlan":
		if c.MacvlanMode == "" {
			c.MacvlanMode = "vepa" // a share cannot bypass the parent's shaper (netdev)
		}
	case "ipvlan":
		if c.IPVlanMode == "" {
			c.IPVlanMode = "l2"
		}
	}
	if c.InterfaceName == "" {
		c.InterfaceName = DefaultInterfaceName
	}
}

// Package nodeconfig holds the node agent's configuration file, a
// carve.dev/v1alpha1 NodeConfig, and its strict decoder: an unknown field or
// a bad quantity is an error naming its path. `carve agent --config` and
// `carve discover --config` take it; the chart's nodeConfig value is one, as
// YAML.
//
//	apiVersion: carve.dev/v1alpha1
//	kind: NodeConfig
//	driverName: carve.dev          # default; the chart's driverName must match
//	netdev:
//	  include: ["ens*"]            # globs; empty means every PCI-backed netdev
//	  exclude: ["ens9*"]
//	  includeVirtual: false        # veth, bridges, lo
//	  bandwidth:                   # a link's capacity: needed where the kernel knows no speed; wins over it
//	  - interface: eth0
//	    egress: 10G                # bits per second
//	    ingress: 10G               # defaults to egress
//	  pools:                       # addresses for NetworkConfig.pools
//	  - {name: v4, cidr: 10.0.0.0/24, gateway: 10.0.0.1,
//	     parent: ens1f0, vlan: 0,  # the segment: shares of another parent or VLAN are refused
//	     scope: Cluster}           # default: each address once in the cluster (netdev/addrbook);
//	                               # Node: this node's subnet alone, handed out by the agent by itself
//	  maxSharesPerNIC: 256         # default; at least 1 (the "shares" capacity, package slices)
//	  unsharedFloorPercent: 5      # default 0 (off): the node's own traffic on a NIC gets a class assured 5%
//	requestPolicies:               # how shares may be requested
//	  nic:
//	    egressBandwidth: {default: 100M, min: 10M, step: 10M}
//	    ingressBandwidth: {default: 100M, min: 10M, step: 10M}
//	  llc:
//	    ways: {default: 1, min: 1, step: 1}
//	  gpu:
//	    memory: {default: 10Gi, min: 5Gi, step: 5Gi, max: 40Gi}
//	health:                        # device health taints (package prepare/health)
//	  holdDown: 30s                # default; healthy this long before a taint clears
//	  maxHoldDown: 4m              # default 8 x holdDown; a flapping device's hold-down doubles up to it
//	  effects: {degraded: NoSchedule, lost: NoExecute}   # the defaults, by severity
//	  reasons: {LinkDown: NoExecute}                     # per reason (the taint's value); NoSchedule, NoExecute or None
//	  errorsPerSecond: 10          # default; a NIC's hardware errors (never drops) growing this fast,
//	  errorsPerMillion: 10000      # and past this part of its packets (1%, the default), degrade it; negative rate: off
//
// A claim draws addresses from the pools its NetworkConfig names; where the
// DeviceClass's NetworkConfig names pools, the claim chooses among those
// only (pools belong to classes, so one tenant's class cannot take another
// tenant's subnet). A pool's scope is Cluster unless the node config says
// Node: one node config is usually every node's (the chart's), and a
// subnet on a segment several nodes share must give each address once.
//
// Without a policy, a NIC share defaults to 1% of the link in 1 Mbit/s
// steps, and an LLC share to resctrl's minimum number of ways; a GPU is
// shared in memory slices only with requestPolicies.gpu.memory (and a tier
// that can enforce them, package gpu/memslice).
package nodeconfig

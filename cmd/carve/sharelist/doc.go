// Package sharelist lists the shares prepared on this node and checks that
// each is enforced, for `carve shares`: it reads the agent's checkpoint, the
// classifier's pinned maps and links, and the HTB classes, so it needs no API
// server and changes nothing. Rows are kind-neutral (Row, Source): NIC
// shares come from NICSource, and other kinds (GPU shares) add a Source of
// their own (GPUSource over memslice.ListShares).
//
//	carve shares [--state-dir /var/lib/carve] [--bpf-pin-dir /sys/fs/bpf/carve] [--interval 2s]
//	             [--nvidia-driver-root /] [--nvml-timeout 10s] [-o table|json]
//
// # NIC shares
//
// Every share prepared on this node, from the agent's checkpoint and the
// classifier's pinned maps (opened read-only; nothing is loaded, created or
// changed): the claim, ShareID, parent and the interface in the pod (net1,
// and its name on the node, link), the allocated egressBandwidth and
// ingressBandwidth and the egressRate and ingressRate measured from the
// per-share counters over --interval (bits/s), the drops of the share's HTB
// classes, and enforced: for each direction with a bandwidth, its HTB class
// on the parent's egress shaper (egress) or the parent's IFB (ingress), its
// classifier entry pointing at that class (or the EDT rate of a share an
// older carve paced), the classifier's entry sending the parent's limited
// shares through the shaper, and the programs attached (pinned TCX links in
// the node's namespace, or cls_bpf filters); and, for every share the agent
// gave one, its pod guard (podGuard: pending until a container of the pod
// starts, then attached; detached, or not pinned at all, is a problem).
// Problems says what is missing. The directories default to
// CARVE_STATE_DIR and CARVE_BPF_PIN_DIR, which the chart sets in the
// agent's container; a state directory without the agent's checkpoint is an
// error.
// -o json prints a list of those objects. A share that is not enforced (or
// whose preparation did not complete) makes it exit 1, so it serves as a
// node check. Parents are looked up in the network namespace of /proc/1 (run
// it on the host, or in the agent's pod with the host's PID namespace).
//
// # GPU memory shares
//
// Listed too, kind: gpu, with the keys above (parent is the GPU's UUID, the
// network ones zero) and their own under gpu: uuid, tier, sliceBytes,
// usedBytes, usedFrom, processes, kills (the policing loop's, so far).
// usedBytes is read from nvml (now: NVML's processes of the share's pods,
// where this host has NVML), agent (the policing loop's last reading) or
// dmem.current (the kernel's count, dmem tier); where none of them is
// available it is null and usedUnknown says why; it is never made up. An
// mps-policed share is enforced while its claim's MPS control daemon of the
// GPU runs (its pid file names a live process with its pipe directory; the
// JSON's gpu.mpsDaemon gives the pipe directory, PID and whether it runs); a
// dmem share while every pod cgroup its hook recorded that still exists has
// the slice in dmem.max for the GPU's region. The table prints GPU shares
// under their own header (CLAIM SHARE ID GPU TIER SLICE USED KILLS ENFORCED).
package sharelist

// Package hook is what the container runtime runs, from carve's CDI specs,
// when a container of a pod with a share starts (a createRuntime hook, with
// the OCI state on stdin):
//
//   - netns-attach first refuses a container whose bundle gives it
//     CAP_NET_ADMIN or CAP_SYS_ADMIN, unless the share's class allows it
//     (allowNetAdmin); then it makes a NIC share's interface in the pod's
//     network namespace (moves it there, where an older agent made it on
//     the node), puts the share's pod guard (pinned by the agent) on its
//     egress before it comes up (bpf.PodHook),
//     configures it (its GSO limit and EUI-64 link-local address
//     included), puts the share's ingress AQM program on its ingress, and
//     ties the pod's namespace to the share in the classifier's pinned
//     map;
//   - resctrl-attach puts the container's process in its LLC share's
//     resctrl group;
//   - dmem-limit holds the pod's cgroup to a GPU memory slice (dmem.max).
//
// It runs on the host once per container start, outside carve's image, so
// it is small and static: it imports the standard library, netlink/netns,
// the BPF map it updates (package bpf) and stdlib-only leaves, and nothing
// of Kubernetes, gRPC, metrics, ghw or CDI. cmd/carve-hook builds from it
// alone, and `carve hook` runs the same Main. The attach spec (AttachSpec)
// is the file format between the NIC preparer, which writes it, and this
// hook.
package hook

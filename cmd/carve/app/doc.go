// Package app is carve's composition root on a node (`carve agent`): it
// wires every device kind's preparer into the kubelet plugin (kinds.go), runs
// the rediscovery loop that republishes ResourceSlices (inventory.go), and
// serves metrics and health (servers.go).
//
// # What the agent does
//
// It publishes the node's pool through the kubeletplugin helper, again
// whenever a netlink link event or the periodic rescan finds a change
// (discovery.Scanner), never when nothing changed, and answers
// NodePrepareResources through prepare.Driver, which runs the preparer of
// each allocated device's kind and writes one CDI spec per claim. It installs
// the static carve-hook binary in its state directory for the container
// runtime to run. With --pod-uid, rolling updates are seamless
// (kubeletplugin.RollingUpdate; the chart's DaemonSet uses maxSurge: 1,
// maxUnavailable: 0). SIGTERM stops the agent cleanly; a second signal kills
// it. A node without BPF still serves every kind; its bandwidth shares are
// refused at prepare.
//
// # Flags
//
//   - --kubeconfig: in-cluster by default.
//   - --node-name: $NODE_NAME, else the hostname.
//   - --root, --config: / and none, as for `carve discover`: the host root
//     sysfs and procfs are read under (the chart's /host), and the NodeConfig
//     file.
//   - --cpu-cache-root: none (--root). Read the CPU cache tree
//     (sys/devices/system/cpu/cpu*/cache, sys/fs/resctrl) under this root
//     instead, NICs staying real: for nodes whose sysfs lacks cpu*/cache (the
//     chart's cpuCacheRoot, a host path), and for tests.
//   - --fpga-root: none (--root). Read FPGA cards under this root instead,
//     for tests (the chart's fpgaRoot).
//   - --kubelet-registrar-dir: /var/lib/kubelet/plugins_registry.
//   - --kubelet-plugins-dir: /var/lib/kubelet/plugins; the socket is
//     <dir>/<driver>/dra.sock.
//   - --cdi-dir: /var/run/cdi.
//   - --state-dir: /var/lib/carve; checkpoint and claim files; same path on
//     host and in the pod.
//   - --metrics-addr: 127.0.0.1:9464; Prometheus /metrics, /healthz; the
//     chart binds metricsHost (loopback by default too: the labels name
//     tenants' claims and nothing authenticates a scraper).
//   - --profiling: off. Go's pprof profiles under /debug/pprof/ on the
//     metrics address (make bench saves the agent's CPU profile and execution
//     trace there with CARVE_BENCH_PROFILE=<dir>).
//   - --health-addr: 127.0.0.1:9465; gRPC health service; the chart binds
//     the pod IP, which the liveness probe dials.
//   - --pod-uid: $POD_UID; turns on seamless rolling updates.
//   - --rescan-interval: 1m.
//   - --kube-api-qps, --kube-api-burst: 200, 400; client-go's default 5
//     would cap prepares at 5 claims/s.
//   - --host-netns: <root>/proc/1/ns/net; the node's network namespace,
//     where parent NICs live.
//   - --bpf-pin-dir: /sys/fs/bpf/carve; the classifier's pins; must be on
//     the host's bpffs.
//   - --nvidia-driver-root: /; where the host's NVIDIA driver is (e.g.
//     /usr/local/nvidia), read below --root.
//   - --nvidia-cdi-hook: none; the host's nvidia-cdi-hook, to run NVIDIA's
//     container hooks.
//   - --nvml-replay: none; answer NVML from a replay file.
//   - --nvml-replay-processes: none; with --nvml-replay, the GPUs'
//     processes and their memory from a file read on every query
//     (nvmlreplay.ProcessesFile; tests).
//   - --nvml-timeout: 10s; bound on every NVML call.
//   - --mps-shm-size: 1Gi; the tmpfs each claim's GPU memory shares have as
//     /dev/shm.
//   - --mps-capabilities: mps.DefaultCapabilities; the only capabilities the
//     claims' MPS daemons and their servers keep ("all": the agent's).
//   - --mps-context-reserve: 640Mi; the part of each mps-policed slice left
//     to a CUDA process's context: the MPS ceiling is the slice less it.
//
// # Metrics
//
// carve_prepare_duration_seconds and carve_unprepare_duration_seconds by kind
// and result, carve_prepared_claims, carve_discovery_duration_seconds,
// carve_publishes_total, carve_publish_errors_total,
// carve_checkpoint_corrupt_total, the NIC shares' carve_share_bytes_total,
// carve_share_packets_total and carve_share_drops_total (package netdev), the
// GPU shares' carve_gpu_share_kills_total, carve_gpu_share_used_bytes and
// carve_gpu_share_kill_reports_suppressed_total (package gpu/police), every
// device's carve_device_health_state and carve_device_health_changes_total
// (package prepare/health, wired in health.go), and the gRPC server
// histograms (grpc_server_handling_seconds).
package app

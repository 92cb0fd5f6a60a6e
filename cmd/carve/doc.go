// Command carve is carve's command line (cobra, with component-base logging
// flags): it parses the flags of its commands and wires them to the packages
// that do the work.
//
//   - `carve agent`: the kubelet plugin on a node (package cmd/carve/app).
//   - `carve discover`: print the node's pool exactly as the agent publishes
//     it (packages discovery and slices).
//   - `carve shares`: list the shares prepared on this node and check that
//     each is enforced (package cmd/carve/sharelist).
//   - `carve snapshot -o FILE.tar.gz`: capture what discovery reads (package
//     discovery/snapshot); `carve discover --from FILE.tar.gz` replays it.
//   - `carve hook netns-attach|resctrl-attach|dmem-limit`: the container
//     runtime hooks (package prepare/hook), for images without the static
//     carve-hook (cmd/carve-hook).
//   - `carve host-mounts`: the chart's init container (package
//     prepare/hostmount).
//   - `carve completion bash|zsh|fish`: a shell completion script.
//
// `carve --help` and `carve <command> --help` list every flag. Flags of
// `carve discover`:
//
//   - --root: / ; host root to read sysfs and procfs under.
//   - --node-name: $NODE_NAME, else the hostname.
//   - --config: none; NodeConfig file (package slices/nodeconfig).
//   - -o, --output: yaml; yaml or json.
//   - --nvml-replay: none; answer NVML from a JSON inventory (package
//     discovery/nvmlinfo has the format).
//   - --from: none; discover the node a `carve snapshot` captured.
//   - --cpu-cache-root, --fpga-root: none; as for the agent.
//   - --nvidia-driver-root, --nvml-timeout: / and 10s, as for the agent.
//   - -v: 0; log verbosity (every command).
//   - --logging-format: text; text or json (every command); logs go to
//     stderr.
//
// For example:
//
//	go run ./cmd/carve discover                       # this machine
//	go run ./cmd/carve discover --root /snapshot -o json --node-name n1 --config node.yaml
//
// The binary is built with cgo (go-nvml): make sets CGO_ENABLED=1 and
// CGO_CFLAGS=-Wno-deprecated-declarations. It is built with the tags in the
// file buildtags (grpcnotrace, which makes it a third smaller; the file says
// why): `go build -tags grpcnotrace ./cmd/carve`.
package main

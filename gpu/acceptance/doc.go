// Package acceptance is the acceptance run of carve's GPU paths on a real
// GPU, one command set, each part well under 10 minutes (a lent machine's
// call). The runs themselves are the tests built only with -tags
// acceptance (run.sh); what they compare and judge is plain code here,
// tested without a GPU against the real H100's recorded answers
// (results/, ../prep/testdata).
//
// `gpu/acceptance/run.sh build` makes the test binary and carve; on a bare
// GPU host with python3, as root:
//
//   - `./run.sh record DIR [DRIVER_ROOT]`: the environment record
//     (nvidia-smi, NVML through ctypes, carve discover and snapshot).
//   - `./run.sh discovery`: each GPU's uuid, bus id and memory as carve
//     finds them against `nvidia-smi --query-gpu` (DiscoveryRows).
//   - `./run.sh mig`: with MIG on GPU 0 (already, or `--enable-mig`, which
//     turns it on and off again after), every placement `nvidia-smi mig
//     -lgipp` lists is published once with the name `-lgip` gives
//     (PlacementRow); each is prepared, the CUDA client started as the
//     tenant uid (1001) with the claim's device nodes as its whole /dev,
//     read-only and with the host nodes' modes (StartWithDevices, as a
//     container's), must see exactly the instance made, and it is
//     unprepared with nothing left; two claims' instances that share no
//     slice are prepared side by side and each tenant's client must see
//     its own only, the one its CARVE_<REQUEST>_MIG_UUID names
//     (besideRow); for every pair of placements the
//     published counters must allow both exactly where the driver makes
//     both (CountersAllow, PairsRow).
//   - `./run.sh probe`: the MPS probe (TestMPSProbe, probe.go), the numbers
//     a slice's enforcement rests on. A 4 GiB share of GPU 0 is prepared
//     through carve's GPU preparer and memory-slice manager, as the agent
//     wires them (sharePreparer): the claim's own control daemon, its
//     ceiling set_default_device_pinned_mem_limit at the slice, the state
//     directory 0711 (prepare.EnsureStateDir) with the claim's tree below
//     it. Clients run as --tenant-uid (1001 in `device`: the uid-1001
//     server must pass through the state directory, the layout that was
//     0700 and hid the pipe directory from non-root servers) through the
//     pipe directory read-only, each a fresh process: the slice first, then
//     bisection to 64 MiB (ProbeStep, about 7 clients) for the largest
//     allocation MPS allows. While each holds, NVML is read: the client's
//     used memory (compute processes and MPS clients apart), the claim's
//     nvidia-cuda-mps-server's (by the daemon's server list and the
//     process name) and the GPU's used memory; and once no client is left,
//     the server's again. It prints a markdown table (slice, largest
//     allowed allocation, NVML's figure for that process, figure less
//     allocation: the CUDA context, whether the figure is over the slice,
//     i.e. whether policing at the slice would kill a process MPS allows;
//     the server's figure with a client and without, the GPU's used memory
//     before the share, with its daemon alone, with the client and with the
//     server idle) and a RESULT: line that `device` puts in the summary.
//     Policing is wired but not run: a kill would end the reading.
//   - `./run.sh slices`: GPU memory slices, two shares of GPU 0 (10 GiB
//     and 20 GiB) through carve's GPU preparer, clients in per-share
//     cgroups as pods: allowed and held allocations, the variable raised,
//     two processes, a process skipping MPS, the 20 GiB share computing
//     throughout as another uid (another tenant with its own daemon), no
//     /dev/shm across claims, teardown. "Held" means never over the slice
//     for longer than Bound.
//   - `./run.sh chart`: the agent as the chart runs it: the test binary
//     re-run chrooted in a root holding only itself and its libraries
//     (BuildRoot, StartChrooted: the shape of the agent's image), the host
//     at /host, its /proc, /dev and /sys, the state directory shared; it
//     prepares a share whose daemon starts from the host's mount namespace,
//     and a client on the host must get memory through the MPS server that
//     daemon started, the host's binary.
//
// On a lent machine (one command of at most 10 minutes, 64 MiB of files
// carried, a few files back), `make gpu-acceptance-pack` (`run.sh pack`)
// puts the binaries, stripped and gzipped, and the scripts in
// gpu/acceptance/pack/ (it fails over 64 MiB); carrying it,
// `cd gpu/acceptance/pack && OUT=$OUT ./run.sh device` runs every part in
// at most 7 minutes, each under its own timeout (the test binary's 10 s
// inside it: environment, record 45 s, discovery 45 s, mig 90 s, probe
// 60 s, slices 150 s, chart 75 s, each cut to what is left of the 7
// minutes), with the driver root it finds (/, /usr/local/nvidia, ...), the
// compute and MIG modes kept, `mig`, `probe` and `slices` as tenant uid 1001 and
// `chart` with PATH alone for an environment. It stops after `discovery`
// under gVisor (uname -r 4.4.0), where MPS cannot work. $OUT (./out unless
// set) gets summary.txt (a part a line: rc, seconds, PASS, FAIL or SKIP and
// why; probe's PASS with its numbers), environment.txt, record.tar.gz and a
// log a test part (discovery, mig, probe, slices, chart): 8 files.
//
// The clients are cudaclient.py (ctypes on libcuda.so.1: no wheels);
// `--torch` runs the PyTorch client.py of the earlier runs instead.
// --keep-compute-mode (for lent machines) never changes the compute mode,
// and without --enable-mig the MIG mode is never changed; --dry-run prints
// the plan. Results on a lent H100 are in results/ (the memory slices; the
// other parts have not run on a card yet).
package acceptance

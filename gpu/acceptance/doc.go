// Package acceptance is the acceptance run of GPU memory slices on a real
// GPU: two shares of GPU 0 (10 GiB and 20 GiB) prepared through carve's own
// GPU preparer, client processes (python3 with PyTorch, client.py) in
// per-share cgroups as pods would be, and one table row per attack. The run
// itself is acceptance_test.go, built only with -tags acceptance (run.sh);
// the verdicts and the table are plain code, tested without a GPU.
//
// `gpu/acceptance/run.sh build` makes the test binary; on a bare GPU machine
// with python3 and PyTorch, as root, `./run.sh` prepares a 10 GiB and a 20
// GiB share of GPU 0 through carve's GPU preparer, runs client processes in
// per-share cgroups and prints one row per attack: 8 GiB allowed; 12 GiB; 12
// GiB with the variable raised; two processes of 8 GiB; a process skipping
// MPS; the 20 GiB share computing throughout; prepare latency; teardown. Its
// clients run with the share's environment and its /dev/shm, as its
// container would. "Held" means never over the slice for longer than the
// bound (package police). The "skips MPS" row is policing's (compute mode
// Default while shared). --keep-compute-mode (for lent machines) never
// changes the compute mode; --dry-run prints the plan. Teardown checks that
// every claim's daemon, tmpfs and directory are gone. `./run.sh record DIR`
// records the environment, nvidia-smi and NVML as the driver answers.
//
// Results on a lent H100 are in results/.
package acceptance

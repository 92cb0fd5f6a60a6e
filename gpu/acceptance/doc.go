// Package acceptance is the acceptance run of GPU memory slices on a real
// GPU: two shares of GPU 0 (10 GiB and 20 GiB) prepared through carve's own
// GPU preparer, client processes (python3 with PyTorch, client.py) in
// per-share cgroups as pods would be, and one table row per attack. The run
// itself is acceptance_test.go, built only with -tags acceptance (run.sh);
// the verdicts and the table are plain code, tested without a GPU.
package acceptance

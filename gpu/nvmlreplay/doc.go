// Package nvmlreplay answers NVML from an nvmlinfo.Inventory (a replay file
// or a snapshot's nvml.json) through go-nvml's own mock package, so that
// discovery, publishing and MIG prepare run unchanged on a machine without
// the GPUs.
package nvmlreplay

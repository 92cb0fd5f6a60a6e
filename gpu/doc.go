// Package gpu reads a node's NVIDIA GPUs and their MIG placements from NVML
// (the real library or go-nvml's mock) into an nvmlinfo.Inventory, within a
// time bound, so that a missing, failing or hung driver costs the node its
// GPUs and never the agent.
package gpu

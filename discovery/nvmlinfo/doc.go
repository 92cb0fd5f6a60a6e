// Package nvmlinfo is a node's NVML inventory as plain data: the JSON format
// that `carve discover --nvml-replay` reads and `carve snapshot` writes. Its
// keys are a contract; decoding rejects unknown keys.
package nvmlinfo

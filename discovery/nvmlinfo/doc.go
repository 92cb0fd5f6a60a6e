// Package nvmlinfo is a node's NVML inventory as plain data: the JSON format
// that `carve discover --nvml-replay` (and the agent's --nvml-replay, the
// chart's nvmlReplayFile) reads and `carve snapshot` writes. Its keys are a
// contract; decoding rejects unknown keys. Package gpu reads NVML into it;
// package gpu/nvmlreplay answers NVML from it.
//
//	{"driverVersion": "580.159.04", "cudaDriverVersion": 13000,
//	 "devices": [{"index": 0, "minor": 0, "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
//	              "pciBusId": "00000000:19:00.0", "memoryTotalBytes": 85520809984, "architecture": "hopper",
//	              "computeCapability": "9.0", "migCapable": true, "migEnabled": false,
//	              "migProfiles": [{"profileIndex": 2, "profileId": 9, "name": "3g.40gb", "sliceCount": 3, "instanceCount": 2,
//	                               "memorySizeMB": 40448, "multiprocessorCount": 60,
//	                               "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}],
//	                               "engines": {"copyEngineCount": 3, "decoderCount": 3, "encoderCount": 0, "jpegCount": 3, "ofaCount": 0}}]}]}
//
// The keys:
//
//   - driverVersion, cudaDriverVersion: NVML's system driver version and
//     CUDA driver version (13000 is 13.0).
//   - index, minor, uuid, name: NVML's device index, /dev/nvidia<minor>,
//     UUID, product name; index, minor and uuid unique.
//   - pciBusId: NVML's bus ID (8-digit domain); it joins the GPU to its PCI
//     function. A GPU absent from PCI discovery is still published, without
//     topology, with a warning naming it.
//   - memoryTotalBytes, architecture, computeCapability: total memory,
//     lower-case architecture, MAJOR.MINOR.
//   - migCapable, migEnabled: MIG mode (migEnabled needs migCapable).
//   - migProfiles: optional: each GPU-instance profile (profileIndex is
//     NVML's GPU_INSTANCE_PROFILE_* constant that GetGpuInstanceProfileInfo
//     takes, profileId the Id it answers, which placements and instances use:
//     on a real H100 3g.40gb is index 2, Id 9; name without NVML's "MIG "
//     prefix, or as nvidia-smi builds it where the driver gives none; memory
//     in MiB; engines NVML's engine counts) with its placements (start, size,
//     at most 29 slices). A file without profileIndex (written before carve
//     recorded it) gets it derived from the slice count and the name's
//     attributes (+me the REV1 index, a 1-slice profile with twice the memory
//     1_SLICE_REV2), with a warning where that was a guess; one without
//     engines gives the +me profiles the GPU's one OFA. Absent: go-nvml's
//     mock table for that product, with a warning that says so.
//   - events: optional, replay files only (`carve snapshot` writes none,
//     and a file without it reads as before): what the replay delivers over
//     time, the way the card would, each {"afterMs": 500, "uuid": "GPU-...",
//     "type": "xid", "xid": 79}, afterMs counted from when the replay is
//     loaded (the agent's start). Types: xid (with its xid) and doubleBitEcc
//     come through NVML's event sets (EventSetCreate, RegisterEvents, Wait);
//     rowRemapPending and rowRemapFailed change what GetRemappedRows answers
//     from then on; gpuLost makes the GPU answer GPU_IS_LOST (and a waiting
//     event set return it); recovered undoes those three (a reset). The
//     agent's GPU health source (package gpu, health.go) reads them as it
//     reads a real card's; tests also inject events at once (nvmlreplay's
//     Replay.Inject).
//   - instances: optional, MIG enabled only: the GPU instances that exist
//     (profileId, start, size), whoever made them. The replay makes them;
//     the agent keeps the placements of those it did not make out of the
//     published pool.
//
// Package nvmltest builds the test nodes' inventories (an 8 x H100 node as a
// real H100 reports on driver 580, an A100 node from go-nvml's mock table).
package nvmlinfo

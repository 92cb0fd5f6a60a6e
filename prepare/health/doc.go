// Package health turns what health sources observe of each device into
// taints that come and go on their own.
//
// A Source (one per kind and signal: a NIC's link, its error counters, a
// GPU's NVML events) reports Conditions to a Sink: a device's severity
// (Healthy, Degraded, Lost), a reason (a taint value such as LinkDown or
// XID79) and a message. The Tracker keeps, per device, the worst condition
// its sources report, and a state machine:
//
//	healthy ──fails──► tainted ──sources healthy──► recovering ──hold-down passed──► healthy
//	                      ▲                              │
//	                      └──────── fails again ─────────┘ (a flap: the hold-down doubles, up to the cap)
//
// A device is tainted the moment a source calls it unhealthy; its taint
// clears once every source has called it healthy for the hold-down
// (nodeconfig Health.HoldDown, 30 s by default). A device that fails again
// while it is held down, or soon after its taint cleared, flaps: its
// hold-down doubles, up to Health.MaxHoldDown. A link flapping every
// second for 30 s therefore makes one taint that stays until the link has
// been steady for the (grown) hold-down, not thirty taints and evictions.
// While tainted, a worse condition (lost after degraded) replaces the
// taint's reason; a milder one does not.
//
// The Tracker only decides; the agent (cmd/carve/app) publishes the taints
// in the ResourceSlices, reports the same state on the kubelet's health
// stream, records Events on the claims' pods and keeps the metrics.
package health

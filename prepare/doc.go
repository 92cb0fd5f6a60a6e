// Package prepare is carve's kubelet plugin: it answers the kubelet's
// NodePrepareResources and NodeUnprepareResources through the
// k8s.io/dynamic-resource-allocation kubeletplugin helper, dispatches each
// allocated device to the preparer for its kind, writes one CDI spec per
// claim, and records every step in a crash-safe checkpoint. It is the only
// package that talks to the helper and owns the checkpoint; preparers never
// touch either.
package prepare

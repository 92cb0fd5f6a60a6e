// Package prepare is carve's kubelet plugin core: the Driver answers the
// kubelet's NodePrepareResources and NodeUnprepareResources through the
// k8s.io/dynamic-resource-allocation kubeletplugin helper, and dispatches
// each allocated device to the Preparer of its kind.
//
// # The contract of a device kind
//
// A device kind is prepared by a type that implements Preparer (and
// Restorer, where it keeps state in memory): given an Allocation (the claim,
// the device, the ShareID and consumed capacity of a share, and the
// effective carve.dev/v1alpha1 configuration) and the published device, it
// makes the device usable on the host and returns Prepared: the container
// edits, an undo record, and network data for the claim's status. The kinds
// are netdev.NICPreparer, fpga.Preparer and llc.Preparer.
//
// # What the driver does around a preparer
//
// Before anything is applied the driver decodes and validates the claim's
// opaque configuration (package api/v1alpha1), checks that no device is
// prepared twice and that shares fit the device's capacity, and records the
// claim as started in the checkpoint (package checkpoint). After the
// preparers it writes the claim's CDI spec (package cdi) and info file,
// records the claim as completed, and reports network data in the claim's
// status (package status). A claim found started after a crash is rolled
// back through the preparers' Unprepare and prepared again. The agent
// (package agent) wires every kind and runs the plugin on a node.
package prepare

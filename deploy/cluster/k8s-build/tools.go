//go:build tools

// Package tools names the commands build-binaries.sh builds, so that
// `go mod tidy` in this wrapper module keeps every module they need in go.mod
// and go.sum. The build tag keeps it out of every normal build.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)

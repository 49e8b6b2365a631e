//go:build tools

// Package tools pins the Kubernetes 1.37.2 commands the lab builds, so that
// go.mod and go.sum here list (and checksum) their whole dependency set.
// It is a module of its own so that the Kubernetes tree never enters
// flock's go.mod.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"
)

//go:build tools

// Package tools pins containerd v1.7.35 and its runc shim: the last
// containerd line Kubernetes 1.35 (the oldest the lab runs) supports.
package tools

import (
	_ "github.com/containerd/containerd/cmd/containerd"
	_ "github.com/containerd/containerd/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/cmd/ctr"
)

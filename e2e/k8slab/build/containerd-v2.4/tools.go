//go:build tools

// Package tools pins containerd v2.4.2 and its runc shim, which the lab
// builds and runs (Kubernetes 1.36 and later need containerd 2).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)

//go:build tools

// Package tools pins the reference CNI plugins the lab chains after flock
// (portmap, bandwidth) and runs beside it (loopback, host-local, ptp),
// current ones rather than a distribution's.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/main/ptp"
	_ "github.com/containernetworking/plugins/plugins/meta/bandwidth"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)

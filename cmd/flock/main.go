// Command flock is the CNI plugin binary the container runtime executes.
package main

import (
	"runtime"

	"code.fritzlab.net/fritzlab/flock/cni/plugin"
)

func main() {
	// One request, one goroutine's work: more Ps only start threads that
	// spin looking for work, which a node starting many pods at once pays
	// for in every plugin process.
	runtime.GOMAXPROCS(1)
	plugin.Main()
}

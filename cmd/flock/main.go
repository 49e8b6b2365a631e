// Command flock is the CNI plugin binary the container runtime executes.
//
// The runtime runs it without arguments (CNI_COMMAND and stdin say what to
// do); `flock --version` prints its build version, as every flock binary
// does. The CNI VERSION command (CNI_COMMAND=VERSION) is the plugin's.
package main

import (
	"fmt"
	"os"
	"runtime"

	"code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo"
	"code.fritzlab.net/fritzlab/flock/cni/plugin"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println(buildinfo.Line("flock"))
		return
	}
	// One request, one goroutine's work: more Ps only start threads that
	// spin looking for work, which a node starting many pods at once pays
	// for in every plugin process.
	runtime.GOMAXPROCS(1)
	plugin.Main()
}

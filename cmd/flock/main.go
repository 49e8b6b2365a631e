// Command flock is the CNI plugin binary the container runtime executes.
package main

import "code.fritzlab.net/fritzlab/flock/cni/plugin"

func main() { plugin.Main() }

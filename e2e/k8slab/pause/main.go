// Command pause is the lab's pod sandbox process (registry.k8s.io/pause):
// it holds the pod's namespaces open and exits on SIGINT or SIGTERM. Built
// statically so its image needs nothing but this binary.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}

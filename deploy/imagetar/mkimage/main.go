// Command mkimage builds flock's container image offline: the static
// binaries in /usr/local/bin of an otherwise empty image, written as a
// docker-archive tarball that `ctr images import` (and `docker load`)
// accept. No registry, no Docker engine. `make image` runs it from the
// module root; the binaries and the image are made by deploy/release,
// which `make release` uses too.
package main

import (
	"flag"
	"fmt"
	"os"

	"code.fritzlab.net/fritzlab/flock/deploy/release"
)

func main() {
	tag := flag.String("tag", "", "image name and tag (default docker.io/fritzlab/flock:<the file VERSION>)")
	out := flag.String("out", "out/flock-image.tar", "output tarball")
	flag.Parse()
	version, err := release.ReadVersion(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	if *tag == "" {
		*tag = release.Image + ":" + version
	}
	// The binaries say the file VERSION whatever the tag.
	if err := release.BuildImage(".", *tag, *out, release.Stamp{Version: version, Commit: release.Commit(".")}); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", *out, "tagged", *tag)
}

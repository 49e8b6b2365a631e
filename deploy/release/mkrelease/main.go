// Command mkrelease writes a flock release: the binaries stamped with the
// file VERSION, the image tagged with it, the deploy manifests pinned to
// that tag, the CHANGELOG's entry and SHA256SUMS, in <out>/<VERSION>/.
// `make release` runs it from the module root (release.Make says what it
// writes and refuses).
package main

import (
	"flag"
	"fmt"
	"os"

	"code.fritzlab.net/fritzlab/flock/deploy/release"
)

func main() {
	out := flag.String("out", "out/release", "where the release goes (as <out>/<VERSION>/)")
	allowDev := flag.Bool("allow-dev", false, "build a pre-release VERSION (vX.Y.Z-dev) too; make release RELEASE_ALLOW_DEV=1")
	commit := flag.String("commit", "", "the commit the binaries are stamped with (default: git rev-parse --short HEAD)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mkrelease: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	dir, err := release.Make(release.Options{Root: ".", Out: *out, AllowDev: *allowDev, Commit: *commit})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkrelease:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", dir)
}

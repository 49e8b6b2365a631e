// Package buildinfo is the version every flock binary prints for
// --version: the main module's version and the VCS revision the go
// command stamps into the binary (runtime/debug.ReadBuildInfo), unless the
// build set them with the linker, as the Makefile and the Dockerfile do
// (a build without .git has no VCS stamp):
//
//	go build -ldflags "-X code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo.version=v0.3.0 \
//	  -X code.fritzlab.net/fritzlab/flock/cmd/internal/buildinfo.commit=abc1234" ./cmd/...
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set by the linker (-X); empty: read from the build info.
var (
	version string
	commit  string
)

// Info is what a binary was built from.
type Info struct {
	Version   string // v0.3.0, a pseudo-version, `git describe` output, or "dev"
	Commit    string // short VCS revision, "-dirty" when the tree was modified; "unknown"
	GoVersion string // go1.26.8
}

// String reads "v0.3.0 (commit abc1234, go1.26.8)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}

// Get returns this binary's build info.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return resolve(bi, version, commit)
}

// Line is what `PROGRAM --version` prints, without the newline:
// "flock-agent v0.3.0 (commit abc1234, go1.26.8)".
func Line(program string) string { return program + " " + Get().String() }

// resolve prefers the linker's values to the build info's.
func resolve(bi *debug.BuildInfo, ldVersion, ldCommit string) Info {
	i := Info{Version: ldVersion, Commit: ldCommit, GoVersion: runtime.Version()}
	var rev string
	var modified bool
	if bi != nil {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if i.Commit == "" && rev != "" {
		if len(rev) > 7 {
			rev = rev[:7]
		}
		i.Commit = rev
		if modified {
			i.Commit += "-dirty"
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	return i
}

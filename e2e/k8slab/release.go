package k8slab

import (
	"fmt"
	"os"
	"strings"
)

// Release is one Kubernetes release the lab runs, with the containerd line
// and the reference CNI plugins it runs it with. Everything is built from
// the Go module proxy (build/<module>) and cached by version.
type Release struct {
	Minor      string // "1.37"
	Kube       string // "v1.37.2"
	Containerd string // "v2.4.2"
	CNIPlugins string // "v1.9.1"
}

// Releases are the ends of the tested window, oldest first. Kubernetes
// 1.35 is the last minor that supports containerd 1.x (1.7 is its last
// line); 1.36 and later need containerd 2.
var Releases = []Release{
	{Minor: "1.35", Kube: "v1.35.4", Containerd: "v1.7.35", CNIPlugins: "v1.9.1"},
	{Minor: "1.37", Kube: "v1.37.2", Containerd: "v2.4.2", CNIPlugins: "v1.9.1"},
}

// Newest is the release the lab runs unless told otherwise (CI runs it).
func Newest() Release { return Releases[len(Releases)-1] }

// ReleaseEnv picks the release: FLOCK_K8S=1.35 (or `make e2e K8S=1.35`).
const ReleaseEnv = "FLOCK_K8S"

// SelectedRelease is the release ReleaseEnv names, the newest if unset.
func SelectedRelease() (Release, error) {
	v := strings.TrimPrefix(os.Getenv(ReleaseEnv), "v")
	if v == "" {
		return Newest(), nil
	}
	var minors []string
	for _, r := range Releases {
		if r.Minor == v {
			return r, nil
		}
		minors = append(minors, r.Minor)
	}
	return Release{}, fmt.Errorf("%s=%q: the lab runs Kubernetes %s", ReleaseEnv, os.Getenv(ReleaseEnv), strings.Join(minors, " or "))
}

// containerd2 tells whether the release runs containerd 2 (its config
// schema and CNI STATUS differ from 1.x).
func (r Release) containerd2() bool { return strings.HasPrefix(r.Containerd, "v2.") }

// CNIVersion is the highest CNI spec version the release's runtime runs
// (its libcni): containerd 1.7 decodes results up to 1.0.0, containerd 2
// up to 1.1.0, and asks every plugin of a 1.1.0 chain for STATUS.
func (r Release) CNIVersion() string {
	if r.containerd2() {
		return "1.1.0"
	}
	return "1.0.0"
}

// kubeModule, containerdModule and pluginsModule are the build modules
// under build/ that pin each part's dependency set.
func (r Release) kubeModule() string { return "kubernetes-v" + r.Minor }

func (r Release) containerdModule() string {
	parts := strings.SplitN(strings.TrimPrefix(r.Containerd, "v"), ".", 3)
	return "containerd-v" + parts[0] + "." + parts[1]
}

func (r Release) containerdImport() string {
	if r.containerd2() {
		return "github.com/containerd/containerd/v2"
	}
	return "github.com/containerd/containerd"
}

func (r Release) String() string {
	return fmt.Sprintf("Kubernetes %s, containerd %s, CNI plugins %s", r.Kube, r.Containerd, r.CNIPlugins)
}

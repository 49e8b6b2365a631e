package install

import (
	"fmt"
	"strconv"
	"strings"

	"code.fritzlab.net/fritzlab/flock/cni/install/report"
)

// The container runtime execs the chain through its own libcni, which
// decodes results only of the spec versions it knows: containerd 1.7
// (libcni 1.1) fails every ADD of a 1.1.0 conflist with "unsupported CNI
// result version", though every plugin supports 1.1.0. So the runtime is
// one more member of the chain: its versions bound the conflist's too.

// specUpTo are the spec versions up to and including last.
func specUpTo(last string) []string {
	all := []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	for i, v := range all {
		if v == last {
			return all[:i+1]
		}
	}
	return all
}

// RuntimeVersions tells the spec versions a runtime runs, from the node's
// status.nodeInfo.containerRuntimeVersion ("containerd://1.7.35"). A
// runtime it does not know (CRI-O, untested) sets no bound: nil.
func RuntimeVersions(runtime string) ([]string, error) {
	name, ver, ok := strings.Cut(runtime, "://")
	if !ok || name == "" || ver == "" {
		return nil, fmt.Errorf("installer: runtime %q: want NAME://VERSION, as a node's status.nodeInfo.containerRuntimeVersion", runtime)
	}
	if name != "containerd" {
		return nil, nil
	}
	major, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(ver, "v"), ".", 2)[0])
	if err != nil {
		return nil, fmt.Errorf("installer: runtime %q: version %q: %w", runtime, ver, err)
	}
	if major < 2 {
		return specUpTo("1.0.0"), nil // libcni 1.1: spec 1.1.0 came with libcni 1.2 (containerd 2.0)
	}
	return specUpTo("1.1.0"), nil
}

// runtimeMember is the runtime as a member of the chain in the report
// ("" when no runtime is known, or one that sets no bound).
func (o Options) runtimeMember() (*report.Plugin, error) {
	if o.Runtime == "" {
		return nil, nil
	}
	vs, err := RuntimeVersions(o.Runtime)
	if err != nil || vs == nil {
		return nil, err
	}
	return &report.Plugin{Type: "runtime", Path: o.Runtime, Versions: vs}, nil
}

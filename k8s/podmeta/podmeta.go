// Package podmeta tells the agent who a pod is: its namespace, name, UID,
// annotations and workload identity (app, image). The standalone source reads
// CNI_ARGS; the Kubernetes source (informer-backed) implements the same
// interface.
package podmeta

import (
	"context"
	"fmt"
	"strings"
)

// CNI_ARGS keys.
const (
	ArgNamespace = "K8S_POD_NAMESPACE"
	ArgName      = "K8S_POD_NAME"
	ArgUID       = "K8S_POD_UID"
	ArgInfra     = "K8S_POD_INFRA_CONTAINER_ID"
	// ArgApp and ArgImage carry workload identity in standalone mode, where
	// no API server can tell which controller owns the pod.
	ArgApp   = "FLOCK_APP"
	ArgImage = "FLOCK_IMAGE"
)

// ID identifies a pod: namespace and name, plus the UID that tells one
// incarnation from the next (a StatefulSet pod re-created under its old
// name). A static pod has two: its own (StaticUID, what the runtime passes
// in K8S_POD_UID) and its mirror pod's in the API (UID), which changes
// whenever kubelet re-creates the mirror while the pod runs on. It is the
// one pod identity every part of the agent uses.
type ID struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	StaticUID string `json:"staticUID,omitempty"`
}

// Incarnation is the UID that stays the same for as long as this
// incarnation runs: the static UID of a static pod, else the UID.
func (id ID) Incarnation() string {
	if id.StaticUID != "" {
		return id.StaticUID
	}
	return id.UID
}

// Same reports whether id and o are one incarnation of one pod (a static
// pod's, whichever mirror each was seen through).
func (id ID) Same(o ID) bool {
	return id.Namespace == o.Namespace && id.Name == o.Name && id.Incarnation() == o.Incarnation()
}

// Key is unique per incarnation ("namespace/name/incarnation").
func (id ID) Key() string { return id.Namespace + "/" + id.Name + "/" + id.Incarnation() }

// String is "namespace/name", for people.
func (id ID) String() string { return id.Namespace + "/" + id.Name }

// Mirrors is implemented by a Source that knows static pods' mirrors in
// the API.
type Mirrors interface {
	// StaticUID is the static UID of the static pod whose mirror id is
	// (the same namespace, name and UID), or "" when it knows no such
	// mirror. It completes IDs recorded before they carried static UIDs.
	StaticUID(id ID) string
}

// Pod is what the agent knows about a pod at ADD time.
type Pod struct {
	ID
	Annotations map[string]string
	// App is the top stable controller's name (pod name for bare pods);
	// Image the first container's image reference. Inputs to ip-algo embed.
	App, Image string
}

// Source looks a pod up. Implementations may wait (bounded by ctx) for a
// cache to catch up with a just-created pod.
type Source interface {
	Lookup(ctx context.Context, args Args) (Pod, error)
}

// Args is CNI_ARGS parsed into key/value pairs.
type Args map[string]string

// ParseArgs parses CNI_ARGS ("K=V;K=V"). Values may contain '=' (only the
// first one splits), which the CNI library's own parser does not allow.
func ParseArgs(s string) (Args, error) {
	out := Args{}
	if s == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("CNI_ARGS: malformed pair %q (want KEY=VALUE)", pair)
		}
		out[k] = v
	}
	return out, nil
}

// MissingArgError is a required CNI_ARGS key that is absent.
type MissingArgError struct{ Key string }

func (e *MissingArgError) Error() string {
	return fmt.Sprintf("CNI_ARGS: %s is missing (the runtime must pass the pod's namespace and name)", e.Key)
}

// PodID returns the pod's namespace, name and UID from args.
func (a Args) PodID() (ID, error) {
	for _, k := range []string{ArgNamespace, ArgName} {
		if a[k] == "" {
			return ID{}, &MissingArgError{Key: k}
		}
	}
	return ID{Namespace: a[ArgNamespace], Name: a[ArgName], UID: a[ArgUID]}, nil
}

// Standalone takes everything from CNI_ARGS: annotations are the keys with
// the flock.fritzlab.net/ prefix, identity comes from FLOCK_APP and
// FLOCK_IMAGE (app defaults to the pod name, as for a bare pod).
type Standalone struct{}

// Lookup implements Source.
func (Standalone) Lookup(_ context.Context, args Args) (Pod, error) {
	id, err := args.PodID()
	if err != nil {
		return Pod{}, err
	}
	p := Pod{ID: id, Annotations: map[string]string{}, App: args[ArgApp], Image: args[ArgImage]}
	if p.App == "" {
		p.App = id.Name
	}
	for k, v := range args {
		if strings.HasPrefix(k, "flock.fritzlab.net/") {
			p.Annotations[k] = v
		}
	}
	return p, nil
}

package agent

import (
	"code.fritzlab.net/fritzlab/flock/agent/store"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// withStaticUID completes a restored record that an agent before static
// UIDs wrote: its pod names a static pod by its mirror's UID alone, so
// readiness reports (which match on the static UID) would miss it, and
// would for good once kubelet re-creates the mirror. The source knows the
// mirror while it still exists; the completed record is written back so
// that it outlives the mirror. A record it cannot complete is kept as it
// is.
func (a *Agent) withStaticUID(r store.Allocation) store.Allocation {
	mirrors, ok := a.cfg.Source.(podmeta.Mirrors)
	if !ok || r.Pod.StaticUID != "" || r.Pod.UID == "" {
		return r
	}
	uid := mirrors.StaticUID(r.Pod)
	if uid == "" {
		return r
	}
	r.Pod.StaticUID = uid
	if err := a.cfg.Store.Put(r); err != nil {
		a.log.Warn("restore: cannot record a static pod's UID; its next start completes it again while the mirror exists", "container", r.ContainerID, "pod", r.Pod, "staticUID", uid, "err", err)
	}
	return r
}

package nodestate

import (
	"fmt"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// podKey is a pod incarnation as readiness sees it: a static pod's
// static UID, not its mirror's UID, which kubelet changes whenever it
// re-creates the mirror while the pod (and its attachments) run on.
type podKey struct{ namespace, name, uid string }

func keyOf(id podmeta.ID) podKey { return podKey{id.Namespace, id.Name, id.Incarnation()} }

func (s *State) addPodLocked(pod podmeta.ID, id string) {
	k := keyOf(pod)
	if s.pods[k] == nil {
		s.pods[k] = map[string]bool{}
	}
	s.pods[k][id] = true
}

func (s *State) removePodLocked(pod podmeta.ID, id string) {
	k := keyOf(pod)
	delete(s.pods[k], id)
	if len(s.pods[k]) == 0 {
		delete(s.pods, k)
		if s.defaultReady {
			// Standalone: readiness is only ever reported for existing
			// pods (flockctl), so it goes with the pod's last attachment.
			delete(s.ready, k)
		}
	}
}

// SetReady records a pod's readiness. Reports for pods without an
// attachment are kept (in Kubernetes mode the informer can beat the ADD).
// It tells whether this changed anything routed.
func (s *State) SetReady(pod podmeta.ID, ready bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setReadyLocked(keyOf(pod), ready)
}

func (s *State) setReadyLocked(k podKey, ready bool) bool {
	prev, known := s.ready[k]
	s.ready[k] = ready
	s.touchPodLocked(k)
	if (known && prev == ready) || (!known && ready == s.defaultReady) || len(s.pods[k]) == 0 {
		return false
	}
	s.changedLocked()
	return true
}

// ForgetPod drops the readiness of a pod that left the API; its remaining
// attachments (kubelet's DEL still to come) fall back to the default. A
// static pod's mirror that kubelet re-creates reports it anew.
func (s *State) ForgetPod(pod podmeta.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := keyOf(pod)
	prev, known := s.ready[k]
	delete(s.ready, k)
	s.touchPodLocked(k)
	if known && prev != s.defaultReady && len(s.pods[k]) > 0 {
		s.changedLocked()
	}
}

// SetReadyByName records readiness for every pod incarnation of
// namespace/name that has an attachment (the operator's override in
// standalone mode, where CNI_ARGS may not carry a UID).
func (s *State) SetReadyByName(namespace, name string, ready bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k := range s.pods {
		if k.namespace == namespace && k.name == name {
			s.setReadyLocked(k, ready)
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("no attachment of pod %s/%s on this node", namespace, name)
	}
	return n, nil
}

// readyLocked is a pod's effective readiness.
func (s *State) readyLocked(pod podmeta.ID) bool {
	if r, ok := s.ready[keyOf(pod)]; ok {
		return r
	}
	return s.defaultReady
}

// Ready is a pod's effective readiness.
func (s *State) Ready(pod podmeta.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readyLocked(pod)
}

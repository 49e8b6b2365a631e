package agent_test

// Static pods in the randomized model (model_test.go): kubelet re-creates
// a static pod's mirror with a new UID while the pod runs on, and the
// informer names the pod through whichever mirror exists.

import (
	"context"
	"fmt"
	"math/rand/v2"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// apiID is how the API (the informer) names a pod: a static pod through
// its current mirror. It reports false for a static pod whose mirror is
// gone. Call with m.mu held.
func (m *model) apiID(pod podmeta.ID) (podmeta.ID, bool) {
	mirror, static := m.mirrors[pod]
	if !static {
		return pod, true
	}
	return podmeta.ID{Namespace: pod.Namespace, Name: pod.Name, UID: mirror, StaticUID: pod.UID}, mirror != ""
}

// newMirror gives a static pod a new mirror (a new UID) with random
// readiness and returns its ID. Call with m.mu held.
func (m *model) newMirror(pod podmeta.ID, rnd *rand.Rand) (podmeta.ID, bool) {
	m.nextID++
	m.mirrors[pod] = fmt.Sprintf("mirror-%d", m.nextID)
	r := rnd.IntN(2) == 0
	m.ready[pod] = r
	id, _ := m.apiID(pod)
	return id, r
}

// recreateMirror deletes a static pod's mirror, as a person or an API
// server restart may, and (mostly at once) re-creates it as kubelet does:
// with a new UID, Ready or not. The informer reports the deletion and the
// new mirror; the pod and its sandboxes stay.
func (m *model) recreateMirror(pod podmeta.ID, rnd *rand.Rand) {
	m.mu.Lock()
	old, present := m.apiID(pod)
	if _, static := m.mirrors[pod]; !static {
		m.mu.Unlock()
		return
	}
	if present {
		delete(m.ready, pod)
		m.mirrors[pod] = ""
	}
	var id podmeta.ID
	var r, created bool
	if !present || rnd.IntN(4) != 0 {
		id, r = m.newMirror(pod, rnd)
		created = true
	}
	m.mu.Unlock()
	if present {
		m.e.a.ForgetPod(old)
	}
	if created {
		m.e.a.SetPodReady(id, r)
	}
}

// Lookup implements podmeta.Source as k8s/pods does, from the model's
// API: CNI_ARGS name a static pod by its static UID, the result carries
// its current mirror's UID too.
func (m *model) Lookup(ctx context.Context, args podmeta.Args) (podmeta.Pod, error) {
	p, err := podmeta.Standalone{}.Lookup(ctx, args)
	if err != nil {
		return p, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.apiID(p.ID)
	if !ok {
		return p, fmt.Errorf("pod %s: no mirror in the API", p.ID)
	}
	p.ID = id
	return p, nil
}

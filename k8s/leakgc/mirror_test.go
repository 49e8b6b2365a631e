package leakgc

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// scriptedAPI answers Exists from a script and notes, for each question,
// how many allocations had been released before it was asked.
type scriptedAPI struct {
	mu      sync.Mutex
	a       *fakeAllocs
	answers []bool
	asked   []podmeta.ID
	before  []int
}

func (s *scriptedAPI) Exists(_ context.Context, id podmeta.ID) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.before = append(s.before, len(s.a.deleted()))
	s.asked = append(s.asked, id)
	ok := s.answers[0]
	s.answers = s.answers[1:]
	return ok, nil
}

func (s *scriptedAPI) questions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.asked)
}

// A static pod's sandbox was set up through its first mirror; kubelet
// re-created the mirror since. The deletion of the first mirror keeps
// the allocation while the static pod exists; the deletion of the later
// one (the static pod is gone, its DEL never came) releases it.
func TestStaticPodThroughLaterMirror(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m1 := podmeta.ID{Namespace: "kube-system", Name: "dns-vm", UID: "mirror-1", StaticUID: "static"}
		m2 := podmeta.ID{Namespace: "kube-system", Name: "dns-vm", UID: "mirror-2", StaticUID: "static"}
		a := &fakeAllocs{recs: map[string]Attachment{"c1": {ContainerID: "c1", Pod: m1}}}
		api := &scriptedAPI{a: a, answers: []bool{true, false}}
		const grace = 10 * time.Millisecond
		g := &GC{Allocs: lateAllocs{a}, API: api, Grace: grace}
		g.PodGone(m1)
		run(t, g)
		after(grace)
		if q := api.questions(); q != 1 {
			t.Fatalf("%d questions after the first mirror's grace, want 1", q)
		}
		g.PodGone(m2)
		after(grace)
		if d := a.deleted(); len(d) != 1 {
			t.Fatalf("deleted %v after the second mirror's grace, want c1", d)
		}
		api.mu.Lock()
		defer api.mu.Unlock()
		if !slices.Equal(api.asked, []podmeta.ID{m1, m2}) || !slices.Equal(api.before, []int{0, 0}) {
			t.Errorf("asked %v with %v released before each, want [m1 m2] with none", api.asked, api.before)
		}
	})
}

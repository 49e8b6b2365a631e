package relay

import (
	"context"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// Upstream wraps the API server's pods for the relay's informer. It
// learns the resource version of the first list (what Live needs: a
// watch from any version after it is complete in the cache), and fails
// the cache as soon as the informer lists again once live, before the
// relist's objects reach the handler: they come in list order, and one
// newer than a change still to come would be sent first.
func (c *Cache) Upstream(lw kubeclient.ListerWatcher[*corev1.PodList]) *Upstream {
	return &Upstream{c: c, lw: lw, Log: discard, Resume: DefaultResume}
}

// Upstream is the relay informer's ListerWatcher.
type Upstream struct {
	c  *Cache
	lw kubeclient.ListerWatcher[*corev1.PodList]
	// Log says when a watch is resumed.
	Log *slog.Logger
	// Resume paces a watch's resumption; set before the informer runs.
	Resume Resume

	mu     sync.Mutex
	listRV string
}

// ListRV is the resource version the first list was at ("" before it).
func (u *Upstream) ListRV() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.listRV
}

func (u *Upstream) listed(rv string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.listRV == "" {
		u.listRV = rv
	}
}

// startList is a list starting: any but the first fails the cache,
// live or not yet (before Live, its objects could reach the handler
// after Live all the same, and Live would start at the first list).
func (u *Upstream) startList() {
	if u.ListRV() != "" {
		u.c.fail(errRelist)
	}
	u.c.relisting()
}

// List lists the pods (a continuation is the same list's next page).
func (u *Upstream) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	if opts.Continue == "" {
		u.startList()
	}
	l, err := u.lw.List(ctx, opts)
	if err == nil && opts.Continue == "" {
		u.listed(l.ResourceVersion)
	}
	return l, err
}

// Watch watches the pods; one that streams a list first (watch-list) is
// a list. Once the list is in, the watch resumes through the API
// server's ends and failures (resumingWatch).
func (u *Upstream) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	initial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	if initial {
		u.startList()
	}
	w, err := u.lw.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	return u.resuming(ctx, w, opts, initial), nil
}

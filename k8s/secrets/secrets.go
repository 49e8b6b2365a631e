// Package secrets reads BGP passwords from one Secret in flock's own
// namespace (the agent has no cluster-wide Secret access), watching it so
// a rotated password reaches the sessions.
package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/bgp"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// DefaultName of the password Secret.
const DefaultName = "flock-bgp-passwords"

// Passwords watches the Secret. Use: New, go Run, WaitSynced, then read
// passwords and re-read them whenever Changed fires.
type Passwords struct {
	namespace, name string
	factory         informers.SharedInformerFactory
	informer        cache.SharedIndexInformer
	lister          listers.SecretLister
	changed         chan struct{}
	running         atomic.Bool
}

// New watches namespace/name. The event handler is registered here, before
// any goroutine runs, so nothing is assigned once the informer is live.
func New(client kubernetes.Interface, namespace, name string) *Passwords {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := f.Core().V1().Secrets()
	p := &Passwords{
		namespace: namespace, name: name, factory: f, informer: inf.Informer(), lister: inf.Lister(),
		changed: make(chan struct{}, 1),
	}
	_, _ = p.informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		// The initial list is what the first read after WaitSynced sees:
		// only what happens after it is a change.
		AddFunc: func(_ any, initial bool) {
			if !initial {
				p.notify()
			}
		},
		UpdateFunc: func(o, n any) {
			old, ok1 := o.(*corev1.Secret)
			cur, ok2 := n.(*corev1.Secret)
			if ok1 && ok2 && maps.EqualFunc(old.Data, cur.Data, bytes.Equal) {
				return // metadata only: no session needs touching
			}
			p.notify()
		},
		DeleteFunc: func(any) { p.notify() },
	})
	return p
}

// notify never blocks the informer; a pending signal already covers this
// change, because the reader re-reads every password.
func (p *Passwords) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Changed receives a value after the Secret's data changed (created,
// updated, deleted) since the informer synced. Signals coalesce; one that
// arrives before anybody reads is kept.
func (p *Passwords) Changed() <-chan struct{} { return p.changed }

// Run runs the informer until ctx ends.
func (p *Passwords) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("secrets: Run called twice")
	}
	p.factory.Start(ctx.Done())
	<-ctx.Done()
	p.factory.Shutdown()
	return nil
}

// WaitSynced returns once the informer holds the Secret (or knows it is
// absent), or ctx.Err().
func (p *Passwords) WaitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return fmt.Errorf("secrets: informer for %s/%s did not sync: %w", p.namespace, p.name, ctx.Err())
	}
	return nil
}

// Password implements bgp.PasswordReader for Kubernetes mode: the value
// under the peer's passwordSecretKey, normalised by bgp.NormalizePassword.
func (p *Passwords) Password(peer v1alpha1.Peer) (string, error) {
	if peer.PasswordSecretKey == "" {
		return "", nil
	}
	where := fmt.Sprintf("peer %s: passwordSecretKey %q in Secret %s/%s", peerName(peer), peer.PasswordSecretKey, p.namespace, p.name)
	s, err := p.lister.Secrets(p.namespace).Get(p.name)
	if err != nil {
		return "", fmt.Errorf("%s: %w", where, err)
	}
	v, ok := s.Data[peer.PasswordSecretKey]
	if !ok {
		return "", fmt.Errorf("%s: no such key", where)
	}
	pw, err := bgp.NormalizePassword(v)
	if err != nil {
		return "", fmt.Errorf("%s: %w", where, err)
	}
	return pw, nil
}

// peerName names the peer as bgp.Key does (kept local: the error text
// must not change with the speaker's internals).
func peerName(p v1alpha1.Peer) string {
	if p.Interface != "" {
		return "interface " + p.Interface
	}
	return p.Address
}

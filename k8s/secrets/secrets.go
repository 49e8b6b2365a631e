// Package secrets reads BGP passwords from one Secret in flock's own
// namespace (the agent has no cluster-wide Secret access), watching it so
// a rotated password reaches the sessions.
package secrets

import (
	"bytes"
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

// Client is the Secret API of one namespace: kubeclient's and client-go's
// typed clients both fit.
type Client interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.SecretList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// DefaultName of the password Secret.
const DefaultName = "flock-bgp-passwords"

// Passwords watches the Secret. Use: New, run the factory and wait for
// its sync, then read passwords and re-read them whenever Changed fires.
type Passwords struct {
	namespace, name string
	informer        cache.SharedIndexInformer
	changed         chan struct{}
}

// New watches namespace/name through client, the Secret API of namespace,
// with an informer of f. The event handler is registered here, before the
// informer runs, so nothing is assigned once it is live.
func New(f *kubeclient.Factory, client Client, namespace, name string) *Passwords {
	inf := f.Informer("secret/"+namespace+"/"+name, func() cache.SharedIndexInformer {
		return kubeclient.NewInformer(client, &corev1.Secret{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	})
	p := &Passwords{namespace: namespace, name: name, informer: inf, changed: make(chan struct{}, 1)}
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

// Password is a bgp.PasswordSource for Kubernetes mode: the value under
// the peer's passwordSecretKey as stored (the speaker normalizes it), and
// where it is, for errors (nil and "" when the peer has no password).
func (p *Passwords) Password(peer v1alpha1.Peer) ([]byte, string, error) {
	if peer.PasswordSecretKey == "" {
		return nil, "", nil
	}
	where := fmt.Sprintf("peer %s: passwordSecretKey %q in Secret %s/%s", peerName(peer), peer.PasswordSecretKey, p.namespace, p.name)
	s, err := p.secret()
	if err != nil {
		return nil, where, fmt.Errorf("%s: %w", where, err)
	}
	v, ok := s.Data[peer.PasswordSecretKey]
	if !ok {
		return nil, where, fmt.Errorf("%s: no such key", where)
	}
	if v == nil {
		v = []byte{} // present and empty: an error to the speaker, not "none"
	}
	return v, where, nil
}

// secret returns the cached Secret (shared with the cache: do not modify),
// or a NotFound error as the API would.
func (p *Passwords) secret() (*corev1.Secret, error) {
	obj, ok, err := p.informer.GetIndexer().GetByKey(p.namespace + "/" + p.name)
	if err != nil {
		return nil, err
	}
	s, isSecret := obj.(*corev1.Secret)
	if !ok || !isSecret {
		return nil, apierrors.NewNotFound(corev1.Resource("secret"), p.name)
	}
	return s, nil
}

// peerName names the peer as bgp.Key does (kept local: the error text
// must not change with the speaker's internals).
func peerName(p v1alpha1.Peer) string {
	if p.Interface != "" {
		return "interface " + p.Interface
	}
	return p.Address
}

// Package secrets reads BGP passwords from one Secret in flock's own
// namespace (the agent has no cluster-wide Secret access), watching it so
// a rotated password reaches the sessions.
package secrets

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// DefaultName of the password Secret.
const DefaultName = "flock-bgp-passwords"

// Passwords watches the Secret.
type Passwords struct {
	namespace, name string
	factory         informers.SharedInformerFactory
	informer        cache.SharedIndexInformer
	lister          listers.SecretLister
	// OnChange is called when the Secret changes.
	OnChange func()
}

// New watches namespace/name.
func New(client kubernetes.Interface, namespace, name string) *Passwords {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := f.Core().V1().Secrets()
	p := &Passwords{namespace: namespace, name: name, factory: f, informer: inf.Informer(), lister: inf.Lister()}
	notify := func() {
		if p.OnChange != nil {
			p.OnChange()
		}
	}
	_, _ = p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { notify() }, UpdateFunc: func(any, any) { notify() }, DeleteFunc: func(any) { notify() },
	})
	return p
}

// Start runs the informer and waits for its first sync.
func (p *Passwords) Start(ctx context.Context) error {
	p.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return fmt.Errorf("secrets: informer did not sync: %w", ctx.Err())
	}
	return nil
}

// Password implements bgp.PasswordReader for Kubernetes mode.
func (p *Passwords) Password(peer v1alpha1.Peer) (string, error) {
	if peer.PasswordSecretKey == "" {
		return "", nil
	}
	s, err := p.lister.Secrets(p.namespace).Get(p.name)
	if err != nil {
		return "", fmt.Errorf("peer %s: passwordSecretKey %q: secret %s/%s: %w", peerName(peer), peer.PasswordSecretKey, p.namespace, p.name, err)
	}
	v, ok := s.Data[peer.PasswordSecretKey]
	if !ok || len(v) == 0 {
		return "", fmt.Errorf("peer %s: passwordSecretKey %q: secret %s/%s has no such key", peerName(peer), peer.PasswordSecretKey, p.namespace, p.name)
	}
	return string(v), nil
}

func peerName(p v1alpha1.Peer) string {
	if p.Interface != "" {
		return "interface " + p.Interface
	}
	return p.Address
}

package relay

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// ConfigMapName is the directory of relays, in flock's namespace: a key a
// relay (its pod's name), whose value is its Entry. Each relay writes its
// own key; nodes only read. Trusting the certificates in it is trusting
// whoever may write ConfigMaps in flock's namespace, as nodes already
// trust them with flock's DaemonSet.
const ConfigMapName = "flock-relay"

// Entry is how a node reaches a relay.
type Entry struct {
	// URL is https://host:port (the relay pod's IP).
	URL string `json:"url"`
	// Certificate is the relay's own (PEM): the one a node trusts of it.
	Certificate string `json:"certificate"`
	// ServerName is the name in Certificate.
	ServerName string `json:"serverName"`
}

func (e Entry) validate(name string) error {
	switch {
	case e.URL == "":
		return fmt.Errorf("relay: ConfigMap %s key %q: url is empty", ConfigMapName, name)
	case e.Certificate == "":
		return fmt.Errorf("relay: ConfigMap %s key %q: certificate is empty", ConfigMapName, name)
	case e.ServerName == "":
		return fmt.Errorf("relay: ConfigMap %s key %q: serverName is empty", ConfigMapName, name)
	}
	return nil
}

// Publish writes name's entry (creating the ConfigMap if need be).
func Publish(ctx context.Context, cms corev1client.ConfigMapInterface, name string, e Entry) error {
	if err := e.validate(name); err != nil {
		return err
	}
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"data": map[string]string{name: string(v)}})
	if err != nil {
		return err
	}
	_, err = cms.Patch(ctx, ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName}, Data: map[string]string{name: string(v)}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // another relay made it first
			_, err = cms.Patch(ctx, ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("relay: publish %q in ConfigMap %s: %w", name, ConfigMapName, err)
	}
	return nil
}

// Withdraw removes the entries of names.
func Withdraw(ctx context.Context, cms corev1client.ConfigMapInterface, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	data := map[string]any{}
	for _, n := range names {
		data[n] = nil
	}
	patch, err := json.Marshal(map[string]any{"data": data})
	if err != nil {
		return err
	}
	if _, err := cms.Patch(ctx, ConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("relay: withdraw %q from ConfigMap %s: %w", names, ConfigMapName, err)
	}
	return nil
}

// Lookup reads the directory: the relays by name, and what was wrong
// with entries left out. A missing ConfigMap is no relay.
func Lookup(ctx context.Context, cms corev1client.ConfigMapInterface) (map[string]Entry, []error, error) {
	cm, err := cms.Get(ctx, ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("relay: read ConfigMap %s: %w", ConfigMapName, err)
	}
	out := map[string]Entry{}
	var bad []error
	for name, v := range cm.Data {
		var e Entry
		if err := json.Unmarshal([]byte(v), &e); err != nil {
			bad = append(bad, fmt.Errorf("relay: ConfigMap %s key %q: %w", ConfigMapName, name, err))
			continue
		}
		if err := e.validate(name); err != nil {
			bad = append(bad, err)
			continue
		}
		out[name] = e
	}
	return out, bad, nil
}

package secrets

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

func TestPassword(t *testing.T) {
	cs := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultName, Namespace: "flock-system"},
		Data:       map[string][]byte{"tor1": []byte("s3cret")},
	})
	p := New(cs, "flock-system", DefaultName)
	changed := make(chan struct{}, 4)
	p.OnChange = func() { changed <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if pw, err := p.Password(v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "tor1"}); err != nil || pw != "s3cret" {
		t.Errorf("password: %q %v", pw, err)
	}
	if pw, err := p.Password(v1alpha1.Peer{Address: "fd00::2"}); err != nil || pw != "" {
		t.Errorf("no key: %q %v", pw, err)
	}
	_, err := p.Password(v1alpha1.Peer{Address: "fd00::3", PasswordSecretKey: "tor9"})
	if err == nil || !strings.Contains(err.Error(), `"tor9"`) || !strings.Contains(err.Error(), "fd00::3") || !strings.Contains(err.Error(), DefaultName) {
		t.Errorf("missing key: %v", err)
	}
	// A rotated password is seen and reported.
	_, err = cs.CoreV1().Secrets("flock-system").Update(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultName, Namespace: "flock-system"},
		Data:       map[string][]byte{"tor1": []byte("rotated")},
	}, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		pw, _ := p.Password(v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "tor1"})
		if pw == "rotated" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rotation not seen: %q", pw)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(changed) == 0 {
		t.Error("OnChange not called")
	}
}

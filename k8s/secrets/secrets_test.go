package secrets

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

const ns = "flock-system"

func secret(data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: DefaultName, Namespace: ns}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// start runs p until the test ends and waits for its sync.
func start(t *testing.T, p *Passwords) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.informer.RunWithContext(ctx) // the factory's job in the agent
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), p.informer.HasSynced) {
		t.Fatal("the Secret's informer did not sync")
	}
	return ctx
}

func waitPassword(t *testing.T, p *Passwords, peer v1alpha1.Peer, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pw, _, _ := p.Password(peer)
		if string(pw) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("password %q, want %q", pw, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func signalled(p *Passwords, within time.Duration) bool {
	select {
	case <-p.Changed():
		return true
	case <-time.After(within):
		return false
	}
}

// Defect 10: OnChange was assigned after the informer had started (a data
// race under -race), and a rotation in that window went unreported. Now the
// signal channel exists from New on and a change before the first read of
// Changed() is kept.
func TestRotationBeforeFirstReadIsSignalled(t *testing.T) {
	cs := fake.NewClientset(secret(map[string]string{"tor1": "s3cret"}))
	p := New(kubeclient.NewFactory(), fakeSecrets{cs.CoreV1().Secrets(ns)}, ns, DefaultName)
	ctx := start(t, p)
	tor1 := v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "tor1"}
	if pw, _, err := p.Password(tor1); err != nil || string(pw) != "s3cret" {
		t.Fatalf("password: %q %v", pw, err)
	}
	// The initial list is not a change: the reader has just read it.
	if signalled(p, 100*time.Millisecond) {
		t.Fatal("signal for the initial list")
	}
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, secret(map[string]string{"tor1": "rotated"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPassword(t, p, tor1, "rotated")
	// Nobody was reading Changed() while the update happened.
	if !signalled(p, time.Second) {
		t.Fatal("rotation not signalled")
	}
	// Two changes before a read coalesce into one signal, and no send blocks.
	for _, v := range []string{"r2", "r3"} {
		if _, err := cs.CoreV1().Secrets(ns).Update(ctx, secret(map[string]string{"tor1": v}), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitPassword(t, p, tor1, "r3")
	if !signalled(p, time.Second) {
		t.Fatal("second rotation not signalled")
	}
	if signalled(p, 100*time.Millisecond) {
		t.Error("coalesced changes gave two signals")
	}
	// A metadata-only update touches no session.
	s := secret(map[string]string{"tor1": "r3"})
	s.Labels = map[string]string{"x": "y"}
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if signalled(p, 200*time.Millisecond) {
		t.Error("signal for a label change")
	}
	// Deleting the Secret is a change too.
	if err := cs.CoreV1().Secrets(ns).Delete(ctx, DefaultName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !signalled(p, time.Second) {
		t.Error("deletion not signalled")
	}
}

// A Secret created after the agent started is a change.
func TestSecretCreatedLaterIsSignalled(t *testing.T) {
	cs := fake.NewClientset()
	p := New(kubeclient.NewFactory(), fakeSecrets{cs.CoreV1().Secrets(ns)}, ns, DefaultName)
	ctx := start(t, p)
	tor1 := v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "tor1"}
	if _, _, err := p.Password(tor1); err == nil {
		t.Fatal("no Secret yet: want an error")
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, secret(map[string]string{"tor1": "s3cret"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPassword(t, p, tor1, "s3cret")
	if !signalled(p, time.Second) {
		t.Error("creation not signalled")
	}
}

// The value comes as stored (the speaker normalizes it: bgp's
// TestPasswordSourceNormalized), with where it is; a missing key or
// Secret is an error naming the Secret, the key and the peer.
func TestPasswordAsStoredWithWhere(t *testing.T) {
	cs := fake.NewClientset(secret(map[string]string{"lf": "s3cret\n", "empty": ""}))
	p := New(kubeclient.NewFactory(), fakeSecrets{cs.CoreV1().Secrets(ns)}, ns, DefaultName)
	start(t, p)
	for _, tc := range []struct {
		peer    v1alpha1.Peer
		want    []byte
		where   string
		errText string
	}{
		{peer: v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "lf"}, want: []byte("s3cret\n"),
			where: `peer fd00::2: passwordSecretKey "lf" in Secret flock-system/flock-bgp-passwords`},
		{peer: v1alpha1.Peer{Interface: "eth1", PasswordSecretKey: "empty"}, want: []byte{},
			where: `peer interface eth1: passwordSecretKey "empty" in Secret flock-system/flock-bgp-passwords`},
		{peer: v1alpha1.Peer{Address: "fd00::2"}}, // no password configured
		{peer: v1alpha1.Peer{Address: "fd00::3", PasswordSecretKey: "tor9"},
			errText: `peer fd00::3: passwordSecretKey "tor9" in Secret flock-system/flock-bgp-passwords: no such key`},
	} {
		raw, where, err := p.Password(tc.peer)
		if tc.errText != "" {
			if err == nil || err.Error() != tc.errText {
				t.Errorf("%s: error %v, want %q", tc.peer.PasswordSecretKey, err, tc.errText)
			}
			continue
		}
		if err != nil || string(raw) != string(tc.want) || (raw == nil) != (tc.want == nil) || where != tc.where {
			t.Errorf("%s: %q %q %v, want %q %q", tc.peer.PasswordSecretKey, raw, where, err, tc.want, tc.where)
		}
	}
}

// fakeSecrets is the fake's Secret client, saying what the fake clientset
// says: it cannot stream a list through a watch (WatchList).
type fakeSecrets struct{ Client }

func (fakeSecrets) IsWatchListSemanticsUnSupported() bool { return true }

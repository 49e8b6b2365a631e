package secrets

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
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
		if err := p.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if err := p.WaitSynced(sctx); err != nil {
		t.Fatal(err)
	}
	return ctx
}

func waitPassword(t *testing.T, p *Passwords, peer v1alpha1.Peer, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pw, _ := p.Password(peer)
		if pw == want {
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
	p := New(cs.CoreV1().Secrets(ns), ns, DefaultName)
	ctx := start(t, p)
	tor1 := v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "tor1"}
	if pw, err := p.Password(tor1); err != nil || pw != "s3cret" {
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
	p := New(cs.CoreV1().Secrets(ns), ns, DefaultName)
	ctx := start(t, p)
	tor1 := v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "tor1"}
	if _, err := p.Password(tor1); err == nil {
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

// Defect 9: a value from `kubectl create secret --from-file` keeps the
// file's trailing newline, so TCP-MD5 never matched. Bad values are errors
// naming the Secret, the key and the peer.
func TestPasswordNormalisedAndValidated(t *testing.T) {
	cs := fake.NewClientset(secret(map[string]string{
		"lf":    "s3cret\n",
		"crlf":  "s3cret\r\n",
		"plain": "s3cret",
		"long":  strings.Repeat("x", 81) + "\n",
		"empty": "",
		"nl":    "\n",
	}))
	p := New(cs.CoreV1().Secrets(ns), ns, DefaultName)
	start(t, p)
	for _, tc := range []struct {
		peer    v1alpha1.Peer
		want    string
		errText string
	}{
		{peer: v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "lf"}, want: "s3cret"},
		{peer: v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "crlf"}, want: "s3cret"},
		{peer: v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "plain"}, want: "s3cret"},
		{peer: v1alpha1.Peer{Address: "fd00::2"}, want: ""}, // no password configured
		{
			peer:    v1alpha1.Peer{Address: "fd00::3", PasswordSecretKey: "long"},
			errText: `peer fd00::3: passwordSecretKey "long" in Secret flock-system/flock-bgp-passwords: password is too long: 81 bytes, TCP-MD5 keys are at most 80`,
		},
		{
			peer:    v1alpha1.Peer{Interface: "eth1", PasswordSecretKey: "empty"},
			errText: `peer interface eth1: passwordSecretKey "empty" in Secret flock-system/flock-bgp-passwords: password is empty`,
		},
		{
			peer:    v1alpha1.Peer{Address: "192.0.2.1", PasswordSecretKey: "nl"},
			errText: `peer 192.0.2.1: passwordSecretKey "nl" in Secret flock-system/flock-bgp-passwords: password is empty`,
		},
		{
			peer:    v1alpha1.Peer{Address: "fd00::3", PasswordSecretKey: "tor9"},
			errText: `peer fd00::3: passwordSecretKey "tor9" in Secret flock-system/flock-bgp-passwords: no such key`,
		},
	} {
		pw, err := p.Password(tc.peer)
		if tc.errText != "" {
			if err == nil || err.Error() != tc.errText {
				t.Errorf("%s: error %v, want %q", tc.peer.PasswordSecretKey, err, tc.errText)
			}
			continue
		}
		if err != nil || pw != tc.want {
			t.Errorf("%s: %q %v, want %q", tc.peer.PasswordSecretKey, pw, err, tc.want)
		}
	}
}

func TestRunTwice(t *testing.T) {
	p := New(fake.NewClientset().CoreV1().Secrets(ns), ns, DefaultName)
	start(t, p)
	if err := p.Run(context.Background()); err == nil {
		t.Error("second Run: want an error")
	}
}

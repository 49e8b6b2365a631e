package secrets

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
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

// start runs p until the test ends and waits for it to list and to watch
// (the fake drops events between its list and its watch).
func start(t *testing.T, p *Passwords, cs *fake.Clientset) context.Context {
	t.Helper()
	ctx := testutil.RunInformer(t, p.informer)
	testutil.WaitWatching(t, cs, "secrets")
	return ctx
}

func waitPassword(t *testing.T, p *Passwords, peer v1alpha1.Peer, want string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("password %q", want), func() (bool, string) {
		pw, _, err := p.Password(peer)
		return string(pw) == want, fmt.Sprintf("%q %v", pw, err)
	})
}

// signalled tells whether Changed() signals within the window. The
// informer calls its handlers after its cache has the change, so a wait
// for a signal after the cache shows the change must be generous
// (testutil.Timeout); a window for none may be short, since a correct
// Passwords never signals in it; 0 looks once.
func signalled(p *Passwords, within time.Duration) bool {
	if within == 0 {
		select {
		case <-p.Changed():
			return true
		default:
			return false
		}
	}
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
	ctx := start(t, p, cs)
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
	if !signalled(p, testutil.Timeout) {
		t.Fatal("rotation not signalled")
	}
	// Two changes before a read are signalled (whether as one signal or
	// two depends on when the informer's handler ran, which its cache does
	// not tell: TestChangesCoalesce checks that).
	for _, v := range []string{"r2", "r3"} {
		if _, err := cs.CoreV1().Secrets(ns).Update(ctx, secret(map[string]string{"tor1": v}), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitPassword(t, p, tor1, "r3")
	if !signalled(p, testutil.Timeout) {
		t.Fatal("second rotation not signalled")
	}
}

// Changes before a read coalesce into one signal, and no send blocks (the
// informer's handler goroutine would stall with it).
func TestChangesCoalesce(t *testing.T) {
	p := New(kubeclient.NewFactory(), fakeSecrets{fake.NewClientset().CoreV1().Secrets(ns)}, ns, DefaultName)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for range 3 {
			p.notify()
		}
	}()
	select {
	case <-sent:
	case <-time.After(testutil.Timeout):
		t.Fatal("notify blocked with nobody reading")
	}
	if !signalled(p, 0) {
		t.Fatal("no signal")
	}
	if signalled(p, 0) {
		t.Error("three changes before a read gave more than one signal")
	}
}

// A metadata-only update touches no session; deleting the Secret is a
// change. (A Passwords of its own: no earlier change's signal can still be
// on its way.)
func TestLabelChangeAndDeletion(t *testing.T) {
	cs := fake.NewClientset(secret(map[string]string{"tor1": "r3"}))
	p := New(kubeclient.NewFactory(), fakeSecrets{cs.CoreV1().Secrets(ns)}, ns, DefaultName)
	ctx := start(t, p, cs)
	s := secret(map[string]string{"tor1": "r3"})
	s.Labels = map[string]string{"x": "y"}
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the label in the cache", func() bool {
		cur, err := p.secret()
		return err == nil && cur.Labels["x"] == "y"
	})
	if signalled(p, 200*time.Millisecond) {
		t.Error("signal for a label change")
	}
	if err := cs.CoreV1().Secrets(ns).Delete(ctx, DefaultName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !signalled(p, testutil.Timeout) {
		t.Error("deletion not signalled")
	}
}

// A Secret created after the agent started is a change.
func TestSecretCreatedLaterIsSignalled(t *testing.T) {
	cs := fake.NewClientset()
	p := New(kubeclient.NewFactory(), fakeSecrets{cs.CoreV1().Secrets(ns)}, ns, DefaultName)
	ctx := start(t, p, cs)
	tor1 := v1alpha1.Peer{Address: "fd00::2", PasswordSecretKey: "tor1"}
	if _, _, err := p.Password(tor1); err == nil {
		t.Fatal("no Secret yet: want an error")
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, secret(map[string]string{"tor1": "s3cret"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPassword(t, p, tor1, "s3cret")
	if !signalled(p, testutil.Timeout) {
		t.Error("creation not signalled")
	}
}

// The value comes as stored (the speaker normalizes it: bgp's
// TestPasswordSourceNormalized), with where it is; a missing key or
// Secret is an error naming the Secret, the key and the peer.
func TestPasswordAsStoredWithWhere(t *testing.T) {
	cs := fake.NewClientset(secret(map[string]string{"lf": "s3cret\n", "empty": ""}))
	p := New(kubeclient.NewFactory(), fakeSecrets{cs.CoreV1().Secrets(ns)}, ns, DefaultName)
	start(t, p, cs)
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

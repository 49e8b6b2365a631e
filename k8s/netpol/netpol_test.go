package netpol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "node name is empty"},
		{Config{NodeName: "n1", QueueID: -1}, "queue ID -1"},
		{Config{NodeName: "n1", QueueID: 70000}, "queue ID 70000"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
		// Run refuses the same config before it touches the API or the
		// kernel.
		err = Run(context.Background(), &rest.Config{Host: "https://192.0.2.1:1"}, tc.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{NodeName: "n1", QueueID: 100}).Validate(); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

// The probe answers on this kernel and leaves no table behind. Which
// answer is right depends on the kernel: it is checked against what the
// nft command says of the same rule.
func TestNftQueueProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("FLOCK_REQUIRE_ROOT") != "" {
			t.Fatal("needs root (nftables)")
		}
		t.Skip("needs root (nftables)")
	}
	got, err := nftQueueWorks()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("nft", "list", "tables").CombinedOutput()
	if strings.Contains(string(out), probeTable) {
		t.Errorf("the probe left table %s: %s", probeTable, out)
	}
	// The same rule through the nft command, in a table of this test.
	const tbl = "flock-netpol-probe-test"
	defer exec.Command("nft", "delete", "table", "inet", tbl).Run()
	want := exec.Command("nft", "-f", "-")
	want.Stdin = strings.NewReader("table inet " + tbl + " { chain c { queue num 65535 bypass; } }\n")
	nftSays, err := want.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run nft (Debian's nftables): %v", err)
	}
	if wantOK := err == nil; got != wantOK {
		t.Errorf("probe says nft queue works = %v; nft says %v (%s)", got, wantOK, strings.TrimSpace(string(nftSays)))
	}
}

// The SCTP probe answers without error on any kernel: yes, or no with the
// reason logged at start (this project's CI kernel has no SCTP).
func TestSCTPProbe(t *testing.T) {
	ok, err := sctpSupported()
	if err != nil {
		t.Fatalf("sctpSupported: %v", err)
	}
	t.Logf("kernel has SCTP: %v", ok)
	if _, statErr := os.Stat("/proc/net/sctp"); (statErr == nil) != ok {
		t.Errorf("probe says SCTP %v, /proc/net/sctp exists: %v", ok, statErr == nil)
	}
}

// What addHandler returns reports synced only once its handler was told
// of every object the informer listed, not when the store is filled: a
// handler that keeps state (the tracker's anycast pods) must not answer
// before.
func TestAddHandlerWaitsForTheHandler(t *testing.T) {
	var objs []runtime.Object
	for i := range 50 {
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: fmt.Sprintf("p%d", i)}})
	}
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.Core().V1().Pods().Informer()
	release := make(chan struct{})
	var seen atomic.Int32
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) {
		<-release
		seen.Add(1)
	}}
	synced, err := addHandler(h, inf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer func() {
		// Shutdown waits for the informer, which waits for the handler.
		unblock()
		cancel()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("no sync")
	}
	all := func() bool {
		for _, s := range synced {
			if !s() {
				return false
			}
		}
		return true
	}
	if all() {
		t.Fatalf("synced with the handler told of %d of 50 pods", seen.Load())
	}
	unblock()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		t.Fatal("no sync after the handler ran")
	}
	if n := seen.Load(); n != 50 {
		t.Fatalf("synced with the handler told of %d of 50 pods", n)
	}
}

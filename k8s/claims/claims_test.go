package claims

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

func TestClaimName(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"192.0.2.1", "ipv4-192.0.2.1"},
		{"0.0.0.0", "ipv4-0.0.0.0"},
		{"255.255.255.255", "ipv4-255.255.255.255"},
		{"2001:db8:100::5", "ipv6-2001-0db8-0100-0000-0000-0000-0000-0005"},
		{"2001:DB8::A", "ipv6-2001-0db8-0000-0000-0000-0000-0000-000a"},
		{"::", "ipv6-0000-0000-0000-0000-0000-0000-0000-0000"},
		{"::1", "ipv6-0000-0000-0000-0000-0000-0000-0000-0001"},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ipv6-ffff-ffff-ffff-ffff-ffff-ffff-ffff-ffff"},
		// IPv4-mapped: the same address as 192.0.2.1, the same claim.
		{"::ffff:192.0.2.1", "ipv4-192.0.2.1"},
		// A zone names a link, not an address: dropped.
		{"fe80::1%eth0", "ipv6-fe80-0000-0000-0000-0000-0000-0000-0001"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			ip := netip.MustParseAddr(tc.in)
			got := ClaimName(ip)
			if got != tc.want {
				t.Fatalf("ClaimName(%s) = %q, want %q", tc.in, got, tc.want)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Fatalf("%q is not a DNS-1123 subdomain: %v", got, errs)
			}
			back, err := ParseClaimName(got)
			if err != nil {
				t.Fatal(err)
			}
			if back != ip.Unmap().WithZone("") {
				t.Fatalf("ParseClaimName(%q) = %s, want %s", got, back, ip.Unmap().WithZone(""))
			}
		})
	}
	if got := ClaimName(netip.Addr{}); got != "" {
		t.Fatalf("ClaimName(invalid) = %q, want \"\"", got)
	}
}

// Injective: distinct addresses get distinct names (ParseClaimName inverts
// ClaimName, and accepts no other spelling).
func TestClaimNameInjective(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	names := map[string]netip.Addr{}
	for i := range 20000 {
		var ip netip.Addr
		if i%2 == 0 {
			var b [4]byte
			for j := range b {
				b[j] = byte(r.UintN(256))
			}
			ip = netip.AddrFrom4(b)
		} else {
			var b [16]byte
			for j := range b {
				b[j] = byte(r.UintN(4)) // many zeros: exercise the compression ClaimName must avoid
			}
			ip = netip.AddrFrom16(b).Unmap()
		}
		n := ClaimName(ip)
		if prev, ok := names[n]; ok && prev != ip {
			t.Fatalf("%s and %s share the name %q", prev, ip, n)
		}
		names[n] = ip
		back, err := ParseClaimName(n)
		if err != nil || back != ip {
			t.Fatalf("ParseClaimName(%q) = %s, %v; want %s", n, back, err, ip)
		}
		if len(n) > 253 || len(validation.IsDNS1123Subdomain(n)) > 0 {
			t.Fatalf("%q is not a DNS-1123 subdomain", n)
		}
	}
	for _, bad := range []string{"", "192.0.2.1", "ipv4-", "ipv4-192.000.2.1", "ipv6-2001-db8--1", "ipv6-2001-DB8-0-0-0-0-0-1",
		"ipv6-2001-0db8-0000-0000-0000-0000-0000-000A", "ipv4-::1", "ipv6-192.0.2.1", "ipv6-0000-0000-0000-0000-0000-ffff-c000-0201"} {
		if ip, err := ParseClaimName(bad); err == nil {
			t.Errorf("ParseClaimName(%q) = %s, want an error", bad, ip)
		}
	}
}

func TestClaimCreatesTheObject(t *testing.T) {
	a := newFakeAPI()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	web := pod("tenant-a", "web-1")
	// The node comes from the Claims when the Claim has none; a mapped
	// address is claimed unmapped.
	cl := claim("::ffff:198.51.100.7", v1alpha1.UseAddresses, "tenant-a-addrs", web, "", "0123456789abcdef")
	if err := c.Claim(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	u, ok := a.get(t, "198.51.100.7")
	if !ok {
		t.Fatal("no AddressClaim ipv4-198.51.100.7")
	}
	if u.GetAPIVersion() != "flock.fritzlab.net/v1alpha1" || u.GetKind() != "AddressClaim" {
		t.Fatalf("apiVersion/kind = %s/%s", u.GetAPIVersion(), u.GetKind())
	}
	var ac v1alpha1.AddressClaim
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ac); err != nil {
		t.Fatal(err)
	}
	want := v1alpha1.AddressClaimSpec{IP: "198.51.100.7", Use: "addresses", Pool: "tenant-a-addrs",
		Pod: &v1alpha1.ClaimPod{Namespace: "tenant-a", Name: "web-1", UID: web.UID}, Node: "node-a", ContainerID: "0123456789abcdef"}
	if !reflect.DeepEqual(ac.Spec, want) {
		t.Fatalf("spec = %+v, want %+v", ac.Spec, want)
	}
	if ac.Labels[LabelNode] != "node-a" || ac.Labels[LabelPool] != "tenant-a-addrs" {
		t.Fatalf("labels = %v", ac.Labels)
	}
	got, err := ClaimOf(u)
	if err != nil {
		t.Fatal(err)
	}
	cl.IP, cl.Node = netip.MustParseAddr("198.51.100.7"), "node-a"
	if !got.Created.Equal(t0) {
		t.Fatalf("Created = %s, want %s", got.Created, t0)
	}
	got.Created = time.Time{}
	if !reflect.DeepEqual(got, cl) {
		t.Fatalf("ClaimOf = %+v, want %+v", got, cl)
	}
}

// A label value has at most 63 characters; a longer node name (valid: a
// DNS subdomain) stays in the spec and out of the labels.
func TestClaimLongNodeName(t *testing.T) {
	a := newFakeAPI()
	long := strings.Repeat("n", 70) + ".example.net"
	c := New(kubeclient.NewFactory(), a, long, quiet())
	if err := c.Claim(context.Background(), claim("2001:db8::1", v1alpha1.UsePod, "p", pod("ns", "x"), "", "c1")); err != nil {
		t.Fatal(err)
	}
	u, _ := a.get(t, "2001:db8::1")
	if _, ok := u.GetLabels()[LabelNode]; ok {
		t.Fatalf("labels = %v: a 82-character node label", u.GetLabels())
	}
	if n, _, _ := unstructured.NestedString(u.Object, "spec", "node"); n != long {
		t.Fatalf("spec.node = %q", n)
	}
}

func TestClaimRejectsBadInput(t *testing.T) {
	c := New(kubeclient.NewFactory(), newFakeAPI(), "node-a", quiet())
	good := claim("2001:db8::1", v1alpha1.UsePod, "p", pod("ns", "x"), "", "c1")
	for name, tc := range map[string]struct {
		mutate func(*Claim)
		want   string
	}{
		"no IP":        {func(c *Claim) { c.IP = netip.Addr{} }, "no IP"},
		"zone":         {func(c *Claim) { c.IP = netip.MustParseAddr("fe80::1%eth0") }, "zone"},
		"anycast":      {func(c *Claim) { c.Use = v1alpha1.UseAnycast }, `use "anycast"`},
		"empty use":    {func(c *Claim) { c.Use = "" }, `use ""`},
		"no container": {func(c *Claim) { c.ContainerID = "" }, "no container ID"},
		"no pod name":  {func(c *Claim) { c.Pod.Name = "" }, "namespace and name are required"},
	} {
		t.Run(name, func(t *testing.T) {
			cl := good
			tc.mutate(&cl)
			err := c.Claim(context.Background(), cl)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Claim: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if err := New(kubeclient.NewFactory(), newFakeAPI(), "", quiet()).Claim(context.Background(), good); err == nil || !strings.Contains(err.Error(), "no node") {
		t.Fatalf("Claim without a node: %v", err)
	}
}

func TestClaimConflictNamesTheHolder(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	b := New(kubeclient.NewFactory(), a, "node-b", quiet())
	holder := claim("2001:db8:100::5", v1alpha1.UsePod, "shared", podmeta.ID{Namespace: "tenant-b", Name: "web-1", UID: "6f1c"}, "", "0123456789abcdef0123")
	if err := b.Claim(ctx, holder); err != nil {
		t.Fatal(err)
	}
	nodeA := New(kubeclient.NewFactory(), a, "node-a", quiet())
	err := nodeA.Claim(ctx, claim("2001:db8:100::5", v1alpha1.UsePod, "shared", pod("tenant-a", "db-0"), "", "fedcba"))
	var ce *ClaimedError
	if !errors.As(err, &ce) {
		t.Fatalf("Claim: %v, want a *ClaimedError", err)
	}
	const want = "2001:db8:100::5 is claimed by pod tenant-b/web-1 (uid 6f1c) on node node-b, container 0123456789ab"
	if err.Error() != want {
		t.Fatalf("error:\n got %s\nwant %s", err, want)
	}
	holder.Node = "node-b"
	if !ce.Holder.Created.Equal(t0) {
		t.Fatalf("holder created %s, want %s", ce.Holder.Created, t0)
	}
	ce.Holder.Created = time.Time{}
	if !reflect.DeepEqual(ce.Holder, holder) || ce.IP != holder.IP {
		t.Fatalf("holder = %+v, want %+v", ce.Holder, holder)
	}
	// Without a UID the message leaves it out.
	e := &ClaimedError{IP: holder.IP, Holder: Claim{Pod: podmeta.ID{Namespace: "n", Name: "p"}, Node: "x", ContainerID: "abc"}}
	if got := e.Error(); got != "2001:db8:100::5 is claimed by pod n/p on node x, container abc" {
		t.Fatalf("error without UID: %s", got)
	}
}

// A retried ADD (or a restart between create and commit) finds its own
// claim: the same container on the same node is success; the same
// container ID on another node is not.
func TestClaimIdempotentRetry(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	cl := claim("198.51.100.1", v1alpha1.UseAddresses, "p", pod("ns", "x"), "", "c1")
	for i := range 3 {
		if err := c.Claim(ctx, cl); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	err := New(kubeclient.NewFactory(), a, "node-b", quiet()).Claim(ctx, cl)
	var ce *ClaimedError
	if !errors.As(err, &ce) || ce.Holder.Node != "node-a" {
		t.Fatalf("same container on another node: %v, want a ClaimedError naming node-a", err)
	}
	// A new sandbox of the same pod is another holder.
	cl.ContainerID = "c2"
	if err := c.Claim(ctx, cl); !errors.As(err, &ce) || ce.Holder.ContainerID != "c1" {
		t.Fatalf("another container of the same pod: %v, want a ClaimedError naming c1", err)
	}
}

// The holder releases between our failed create and our get: we create
// again and win.
func TestClaimRetriesWhenTheHolderVanishes(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	other := New(kubeclient.NewFactory(), a, "node-b", quiet())
	if err := other.Claim(ctx, claim("198.51.100.1", v1alpha1.UseAddresses, "p", pod("ns", "old"), "", "c-old")); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	a.PrependReactor("get", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		handled := false
		once.Do(func() {
			handled = true
			_ = a.Tracker().Delete(GVR, "", action.(clienttesting.GetAction).GetName())
		})
		if handled {
			return true, nil, apierrors.NewNotFound(GVR.GroupResource(), action.(clienttesting.GetAction).GetName())
		}
		return false, nil, nil
	})
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	if err := c.Claim(ctx, claim("198.51.100.1", v1alpha1.UseAddresses, "p", pod("ns", "new"), "", "c-new")); err != nil {
		t.Fatal(err)
	}
	u, _ := a.get(t, "198.51.100.1")
	if id, _, _ := unstructured.NestedString(u.Object, "spec", "containerID"); id != "c-new" {
		t.Fatalf("holder container %q, want c-new", id)
	}
}

func TestClaimAPIErrorIsWrapped(t *testing.T) {
	a := newFakeAPI()
	a.PrependReactor("create", GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(GVR.GroupResource(), "x", errors.New("rbac"))
	})
	err := New(kubeclient.NewFactory(), a, "node-a", quiet()).Claim(context.Background(), claim("198.51.100.1", v1alpha1.UseAddresses, "p", pod("ns", "x"), "", "c1"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "198.51.100.1") || !strings.Contains(err.Error(), "ns/x") {
		t.Fatalf("Claim: %v, want a wrapped Forbidden naming the IP and pod", err)
	}
	var ce *ClaimedError
	if errors.As(err, &ce) {
		t.Fatal("an API error is not a ClaimedError")
	}
}

// 20 goroutines on each of 2 nodes race for the same 10 IPs: each IP ends
// with exactly one holder, and every loser was told that holder.
func TestClaimRace(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	nodes := []*Claims{New(kubeclient.NewFactory(), a, "node-a", quiet()), New(kubeclient.NewFactory(), a, "node-b", quiet())}
	var ips []netip.Addr
	for i := range 10 {
		ips = append(ips, netip.MustParseAddr(fmt.Sprintf("2001:db8:100::%x", i+1)))
	}
	type result struct {
		ip        netip.Addr
		node, ctr string
		err       error
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
		startCh = make(chan struct{})
	)
	for n, c := range nodes {
		for g := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctr := fmt.Sprintf("ctr-%d-%02d", n, g)
				id := podmeta.ID{Namespace: "race", Name: ctr, UID: "uid-" + ctr}
				order := rand.Perm(len(ips))
				<-startCh
				for _, i := range order {
					err := c.Claim(ctx, Claim{IP: ips[i], Use: v1alpha1.UsePod, Pool: "shared", Pod: id, ContainerID: ctr})
					mu.Lock()
					results = append(results, result{ips[i], c.node, ctr, err})
					mu.Unlock()
				}
			}()
		}
	}
	close(startCh)
	wg.Wait()

	holders := map[netip.Addr]Claim{}
	for _, ip := range ips {
		u, ok := a.get(t, ip.String())
		if !ok {
			t.Fatalf("%s: nobody holds it", ip)
		}
		h, err := ClaimOf(u)
		if err != nil {
			t.Fatal(err)
		}
		holders[ip] = h
	}
	wins := map[netip.Addr]int{}
	for _, r := range results {
		h := holders[r.ip]
		if r.err == nil {
			wins[r.ip]++
			if h.ContainerID != r.ctr || h.Node != r.node {
				t.Errorf("%s: %s on %s was told it won, the holder is %s on %s", r.ip, r.ctr, r.node, h.ContainerID, h.Node)
			}
			continue
		}
		var ce *ClaimedError
		if !errors.As(r.err, &ce) {
			t.Errorf("%s: %s: %v, want a ClaimedError", r.ip, r.ctr, r.err)
			continue
		}
		if ce.Holder.ContainerID != h.ContainerID || ce.Holder.Node != h.Node || ce.Holder.Pod != h.Pod || ce.IP != r.ip {
			t.Errorf("%s: %s was told %+v holds it, the holder is %+v", r.ip, r.ctr, ce.Holder, h)
		}
	}
	if len(results) != 2*20*10 {
		t.Fatalf("%d results", len(results))
	}
	for _, ip := range ips {
		if wins[ip] != 1 {
			t.Errorf("%s: %d winners", ip, wins[ip])
		}
	}
}

func TestReleaseOnlyOwn(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	ip := netip.MustParseAddr("198.51.100.1")
	if err := c.Claim(ctx, claim(ip.String(), v1alpha1.UseAddresses, "p", pod("ns", "x"), "", "c1")); err != nil {
		t.Fatal(err)
	}
	// Another container's release leaves the claim alone and is no error.
	if err := c.Release(ctx, ip, "c2"); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.get(t, ip.String()); !ok {
		t.Fatal("another container's Release deleted the claim")
	}
	if n := len(a.deletes()); n != 0 {
		t.Fatalf("%d deletes, want none", n)
	}
	if err := c.Release(ctx, ip, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.get(t, ip.String()); ok {
		t.Fatal("the holder's Release left the claim")
	}
	// Released twice, or never claimed: nothing to do.
	if err := c.Release(ctx, ip, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, netip.MustParseAddr("2001:db8::9"), "c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, ip, ""); err == nil {
		t.Fatal("Release without a container ID: no error")
	}
}

// The delete carries the UID and resourceVersion Release read, so a claim
// re-created by someone else between our get and our delete survives.
func TestReleasePreconditions(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	ip := netip.MustParseAddr("198.51.100.1")
	if err := c.Claim(ctx, claim(ip.String(), v1alpha1.UseAddresses, "p", pod("ns", "x"), "", "c1")); err != nil {
		t.Fatal(err)
	}
	before, _ := a.get(t, ip.String())
	if err := c.Release(ctx, ip, "c1"); err != nil {
		t.Fatal(err)
	}
	dels := a.deletes()
	if len(dels) != 1 {
		t.Fatalf("%d deletes", len(dels))
	}
	pre := dels[0].GetDeleteOptions().Preconditions
	if pre == nil || pre.UID == nil || *pre.UID != before.GetUID() || pre.ResourceVersion == nil || *pre.ResourceVersion != before.GetResourceVersion() {
		t.Fatalf("preconditions %+v, want UID %s and resourceVersion %s", pre, before.GetUID(), before.GetResourceVersion())
	}

	// Race: between our get and our delete, the claim is released and
	// re-claimed by another pod on node-b.
	if err := c.Claim(ctx, claim(ip.String(), v1alpha1.UseAddresses, "p", pod("ns", "x"), "", "c1")); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	a.PrependReactor("delete", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
		once.Do(func() {
			err := a.replace(ClaimName(ip), func(u *unstructured.Unstructured) {
				_ = unstructured.SetNestedField(u.Object, "c-other", "spec", "containerID")
				_ = unstructured.SetNestedField(u.Object, "node-b", "spec", "node")
			})
			if err != nil {
				t.Error(err)
			}
		})
		return false, nil, nil // on to the preconditions check
	})
	if err := c.Release(ctx, ip, "c1"); err != nil {
		t.Fatal(err)
	}
	u, ok := a.get(t, ip.String())
	if !ok {
		t.Fatal("Release deleted the claim re-created by node-b")
	}
	if id, _, _ := unstructured.NestedString(u.Object, "spec", "containerID"); id != "c-other" {
		t.Fatalf("holder %q, want c-other", id)
	}
}

func TestReleaseAPIErrorIsWrapped(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	ip := netip.MustParseAddr("198.51.100.1")
	if err := c.Claim(ctx, claim(ip.String(), v1alpha1.UseAddresses, "p", pod("ns", "x"), "", "c1")); err != nil {
		t.Fatal(err)
	}
	a.PrependReactor("delete", GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is sad")
	})
	err := c.Release(ctx, ip, "c1")
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), ip.String()) {
		t.Fatalf("Release: %v, want a wrapped ServiceUnavailable naming the IP", err)
	}
}

func TestCacheReaders(t *testing.T) {
	a := newFakeAPI()
	ctx := context.Background()
	nodeA, nodeB := New(kubeclient.NewFactory(), a, "node-a", quiet()), New(kubeclient.NewFactory(), a, "node-b", quiet())
	// One claim before the informer lists, the rest seen by its watch.
	if err := nodeA.Claim(ctx, claim("2001:db8:100::2", v1alpha1.UsePod, "shared", pod("ns", "a2"), "", "ca2")); err != nil {
		t.Fatal(err)
	}
	start(t, a, nodeA)
	for _, cl := range []struct {
		c  *Claims
		cl Claim
	}{
		{nodeA, claim("2001:db8:100::1", v1alpha1.UsePod, "shared", pod("ns", "a1"), "", "ca1")},
		{nodeA, claim("198.51.100.1", v1alpha1.UseAddresses, "addrs", pod("ns", "a1"), "", "ca1")},
		{nodeB, claim("2001:db8:100::3", v1alpha1.UsePod, "shared", pod("ns", "b1"), "", "cb1")},
	} {
		if err := cl.c.Claim(ctx, cl.cl); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "the cache holds 4 claims", func() bool { return len(nodeA.all()) == 4 })

	h, ok := nodeA.Taken(netip.MustParseAddr("2001:db8:100::3"))
	if !ok || h.Node != "node-b" || h.ContainerID != "cb1" || h.Pod != pod("ns", "b1") {
		t.Fatalf("Taken(2001:db8:100::3) = %+v, %v", h, ok)
	}
	if h, ok := nodeA.Taken(netip.MustParseAddr("::ffff:198.51.100.1")); !ok || h.Pool != "addrs" {
		t.Fatalf("Taken(mapped 198.51.100.1) = %+v, %v", h, ok)
	}
	if _, ok := nodeA.Taken(netip.MustParseAddr("2001:db8:100::4")); ok {
		t.Fatal("Taken(2001:db8:100::4): a free IP is taken")
	}
	var got []string
	for _, cl := range nodeA.Node() {
		got = append(got, cl.IP.String()+"/"+cl.ContainerID)
	}
	if want := "198.51.100.1/ca1 2001:db8:100::1/ca1 2001:db8:100::2/ca2"; strings.Join(got, " ") != want {
		t.Fatalf("Node() = %v, want %s", got, want)
	}
	if got := nodeA.CountByPool(); len(got) != 2 || got["shared"] != 3 || got["addrs"] != 1 {
		t.Fatalf("CountByPool() = %v", got)
	}

	if err := nodeA.Release(ctx, netip.MustParseAddr("2001:db8:100::1"), "ca1"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the release reaches the cache", func() bool {
		_, ok := nodeA.Taken(netip.MustParseAddr("2001:db8:100::1"))
		return !ok
	})
	if got := nodeA.CountByPool(); got["shared"] != 2 {
		t.Fatalf("CountByPool() after release = %v", got)
	}
}

// A create whose answer is lost (a timeout, a reset connection) may have
// been committed by the API server: Claim reads the claim back. Ours:
// the create went through. Absent: it failed. No answer either: the error
// says so (ErrAmbiguous), and the caller's Release finds it. A refusal
// (4xx) is definite and not read back.
func TestClaimReadsBackAnAmbiguousCreate(t *testing.T) {
	lost := errors.New("http2: client connection lost")
	unavailable := apierrors.NewServiceUnavailable("etcd timeout")
	for name, tc := range map[string]struct {
		commit    bool  // the API server commits the create
		createErr error // what the client sees
		getDown   bool  // the read-back fails too
		wantErr   error // nil: Claim succeeds
		wantClaim bool
		wantGets  int
	}{
		"committed, answer lost":           {commit: true, createErr: lost, wantClaim: true, wantGets: 1},
		"committed, 503":                   {commit: true, createErr: unavailable, wantClaim: true, wantGets: 1},
		"not committed, answer lost":       {createErr: lost, wantErr: lost, wantGets: 1},
		"committed, read-back fails":       {commit: true, createErr: lost, getDown: true, wantErr: ErrAmbiguous, wantClaim: true, wantGets: 1},
		"refused (403): not read back":     {createErr: apierrors.NewForbidden(GVR.GroupResource(), "x", errors.New("rbac")), wantErr: errors.New("forbidden"), wantGets: 0},
		"deadline of the caller's context": {commit: true, createErr: context.DeadlineExceeded, wantClaim: true, wantGets: 1},
	} {
		t.Run(name, func(t *testing.T) {
			a := newFakeAPI()
			a.PrependReactor("create", GVR.Resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
				if tc.commit {
					u := action.(clienttesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
					u.SetUID("uid-committed")
					u.SetResourceVersion("1")
					if err := a.Tracker().Create(GVR, u, ""); err != nil {
						return true, nil, err
					}
				}
				return true, nil, tc.createErr
			})
			gets := 0
			a.PrependReactor("get", GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
				gets++
				if tc.getDown {
					return true, nil, unavailable
				}
				return false, nil, nil
			})
			c := New(kubeclient.NewFactory(), a, "node-a", quiet())
			cl := claim("2001:db8:aa::1", v1alpha1.UseAddresses, "public", pod("ns", "x"), "", "c1")
			err := c.Claim(context.Background(), cl)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("Claim: %v, want success (the claim is ours)", err)
			case tc.wantErr != nil && err == nil:
				t.Fatalf("Claim succeeded, want an error like %v", tc.wantErr)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr) && !strings.Contains(err.Error(), tc.wantErr.Error()):
				t.Fatalf("Claim: %v, want %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "2001:db8:aa::1") {
				t.Errorf("error %q does not name the IP", err)
			}
			if _, ok := a.get(t, "2001:db8:aa::1"); ok != tc.wantClaim {
				t.Errorf("claim exists: %v, want %v", ok, tc.wantClaim)
			}
			if gets != tc.wantGets {
				t.Errorf("%d reads back, want %d", gets, tc.wantGets)
			}
			if errors.Is(err, ErrAmbiguous) {
				// The caller gives it back once the API answers again.
				tc.getDown = false
				if err := c.Release(context.Background(), cl.IP, cl.ContainerID); err != nil {
					t.Fatal(err)
				}
				if _, ok := a.get(t, "2001:db8:aa::1"); ok {
					t.Error("the ambiguously created claim survived its Release")
				}
			}
		})
	}
}

// Changed fires when one of this node's claims leaves the API (kubectl
// delete), not for other nodes' claims.
func TestChangedOnThisNodesDeletedClaims(t *testing.T) {
	a := newFakeAPI()
	mineCl := claim("2001:db8:aa::1", v1alpha1.UseAddresses, "public", pod("ns", "x"), "node-a", "c1")
	other := claim("2001:db8:aa::2", v1alpha1.UseAddresses, "public", pod("ns", "y"), "node-b", "c2")
	for _, cl := range []Claim{mineCl, other} {
		if err := New(kubeclient.NewFactory(), a, cl.Node, quiet()).Claim(context.Background(), cl); err != nil {
			t.Fatal(err)
		}
	}
	c := New(kubeclient.NewFactory(), a, "node-a", quiet())
	start(t, a, c)
	del := func(ip string) {
		t.Helper()
		if err := a.Resource(GVR).Delete(context.Background(), ClaimName(netip.MustParseAddr(ip)), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	del("2001:db8:aa::2")
	testutil.WaitFor(t, "the cache saw node b's claim go", func() bool { return len(c.all()) == 1 })
	select {
	case <-c.Changed():
		t.Fatal("Changed fired for another node's claim")
	default:
	}
	del("2001:db8:aa::1")
	select {
	case <-c.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("Changed did not fire for this node's deleted claim")
	}
}

// A static pod's claim carries its static UID, so whichever mirror the
// agent sees later is the same pod.
func TestClaimKeepsTheStaticUID(t *testing.T) {
	a := newFakeAPI()
	id := podmeta.ID{Namespace: "kube-system", Name: "dns-node-a", UID: "mirror-1", StaticUID: "static-1"}
	if err := New(kubeclient.NewFactory(), a, "node-a", quiet()).Claim(context.Background(), claim("2001:db8:aa::1", v1alpha1.UseAddresses, "public", id, "", "c1")); err != nil {
		t.Fatal(err)
	}
	u, _ := a.get(t, "2001:db8:aa::1")
	got, err := ClaimOf(u)
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod != id || !got.Pod.Same(podmeta.ID{Namespace: "kube-system", Name: "dns-node-a", UID: "mirror-2", StaticUID: "static-1"}) {
		t.Errorf("claim's pod %+v, want %+v (the same pod through a later mirror)", got.Pod, id)
	}
}

package delivery

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/e2e/testutil"
)

const me = "n1" // this node

// Conditions as the EndpointSlice controller writes them (podToEndpoint).
var (
	ready       = discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)}
	notReady    = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(false), Terminating: new(false)}
	termServing = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(true), Terminating: new(true)}
	termGone    = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(false), Terminating: new(true)}
)

func ep(addr, node string, c discoveryv1.EndpointConditions) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: c}
	if node != "" {
		e.NodeName = new(node)
	}
	return e
}

func port(name string, num int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: new(name), Port: new(num), Protocol: new(corev1.ProtocolTCP)}
}

var http = []discoveryv1.EndpointPort{port("http", 80)}

func slice(at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "svc-x", Labels: map[string]string{
			discoveryv1.LabelServiceName: "svc", discoveryv1.LabelManagedBy: controllerName}},
		AddressType: at, Ports: ports, Endpoints: eps,
	}
}

func v4(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return slice(discoveryv1.AddressTypeIPv4, http, eps...)
}

func v4in(local bool, s ...*discoveryv1.EndpointSlice) Input {
	return Input{Local: local, Family: corev1.IPv4Protocol, Node: me, Slices: s}
}

func TestDecide(t *testing.T) {
	const local, cluster = true, false
	for _, tc := range []struct {
		name string
		in   Input
		want Decision
	}{
		// Local policy: CategorizeEndpoints' local set, dropped when empty.
		{"local: a ready local endpoint advertises",
			v4in(local, v4(ep("10.0.0.1", me, ready))),
			Decision{Advertise, ReasonLocalReady, 1}},
		{"local: only a remote ready endpoint withdraws, endpoints elsewhere",
			v4in(local, v4(ep("10.0.0.2", "n2", ready))),
			Decision{Withdraw, ReasonNoLocal, 0}},
		{"local: only a local terminating serving endpoint drains",
			v4in(local, v4(ep("10.0.0.1", me, termServing))),
			Decision{Drain, ReasonLocalTerminating, 1}},
		{"local: a local terminating serving endpoint drains even with remote ready ones",
			v4in(local, v4(ep("10.0.0.1", me, termServing), ep("10.0.0.2", "n2", ready))),
			Decision{Drain, ReasonLocalTerminating, 1}},
		{"local: a local terminating not-serving endpoint is unusable",
			v4in(local, v4(ep("10.0.0.1", me, termGone), ep("10.0.0.2", "n2", ready))),
			Decision{Withdraw, ReasonNoLocal, 0}},
		{"local: nothing usable anywhere",
			v4in(local, v4(ep("10.0.0.1", me, termGone), ep("10.0.0.2", "n2", notReady))),
			Decision{Withdraw, ReasonNone, 0}},
		{"local: a remote terminating serving endpoint counts as usable elsewhere",
			v4in(local, v4(ep("10.0.0.2", "n2", termServing))),
			Decision{Withdraw, ReasonNoLocal, 0}},
		{"local: a local ready and a local terminating one count only the ready one",
			v4in(local, v4(ep("10.0.0.1", me, ready), ep("10.0.0.3", me, termServing))),
			Decision{Advertise, ReasonLocalReady, 1}},
		{"local: only local endpoints are counted",
			v4in(local, v4(ep("10.0.0.1", me, ready), ep("10.0.0.3", me, ready), ep("10.0.0.2", "n2", ready))),
			Decision{Advertise, ReasonLocalReady, 2}},
		{"local: a local not-ready endpoint is unusable",
			v4in(local, v4(ep("10.0.0.1", me, notReady))),
			Decision{Withdraw, ReasonNone, 0}},

		// Cluster policy: ready anywhere, else the serving-terminating fallback.
		{"cluster: a remote ready endpoint advertises",
			v4in(cluster, v4(ep("10.0.0.2", "n2", ready), ep("10.0.0.3", "n3", ready))),
			Decision{Advertise, ReasonClusterReady, 2}},
		{"cluster: ready and terminating serving count only the ready ones",
			v4in(cluster, v4(ep("10.0.0.2", "n2", ready), ep("10.0.0.1", me, termServing))),
			Decision{Advertise, ReasonClusterReady, 1}},
		{"cluster: only terminating serving endpoints anywhere drain",
			v4in(cluster, v4(ep("10.0.0.2", "n2", termServing), ep("10.0.0.3", "n3", termServing), ep("10.0.0.4", "n3", termGone))),
			Decision{Drain, ReasonClusterTerminating, 2}},
		{"cluster: not-ready and terminating not-serving endpoints withdraw",
			v4in(cluster, v4(ep("10.0.0.2", "n2", notReady), ep("10.0.0.3", "n3", termGone))),
			Decision{Withdraw, ReasonNone, 0}},
		{"cluster: a slice with no endpoints withdraws",
			v4in(cluster, v4()),
			Decision{Withdraw, ReasonNone, 0}},

		// Conditions as addEndpoints derives them.
		{"nil conditions mean ready, serving, not terminating (cluster)",
			v4in(cluster, v4(ep("10.0.0.2", "n2", discoveryv1.EndpointConditions{}))),
			Decision{Advertise, ReasonClusterReady, 1}},
		{"nil conditions mean ready, serving, not terminating (local)",
			v4in(local, v4(ep("10.0.0.1", me, discoveryv1.EndpointConditions{}))),
			Decision{Advertise, ReasonLocalReady, 1}},
		{"Ready=false Serving=nil not terminating is unusable",
			v4in(cluster, v4(ep("10.0.0.2", "n2", discoveryv1.EndpointConditions{Ready: new(false)}))),
			Decision{Withdraw, ReasonNone, 0}},
		{"Ready=false Serving=nil Terminating=true is serving: nil Serving means true, not ready",
			v4in(local, v4(ep("10.0.0.1", me, discoveryv1.EndpointConditions{Ready: new(false), Terminating: new(true)}))),
			Decision{Drain, ReasonLocalTerminating, 1}},
		{"Ready=nil Terminating=true is ready",
			v4in(cluster, v4(ep("10.0.0.2", "n2", discoveryv1.EndpointConditions{Terminating: new(true)}))),
			Decision{Advertise, ReasonClusterReady, 1}},
		{"Ready=true Terminating=true is ready, not draining",
			v4in(local, v4(ep("10.0.0.1", me, discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(true)}))),
			Decision{Advertise, ReasonLocalReady, 1}},

		// publishNotReadyAddresses: the controller writes ready=true for all.
		{"publishNotReadyAddresses makes a not-ready endpoint ready",
			Input{Local: true, PublishNotReadyAddresses: true, Family: corev1.IPv4Protocol, Node: me,
				Slices: []*discoveryv1.EndpointSlice{v4(ep("10.0.0.1", me, notReady))}},
			Decision{Advertise, ReasonLocalReady, 1}},
		{"publishNotReadyAddresses makes a terminating not-serving endpoint ready",
			Input{PublishNotReadyAddresses: true, Family: corev1.IPv4Protocol, Node: me,
				Slices: []*discoveryv1.EndpointSlice{v4(ep("10.0.0.2", "n2", termGone))}},
			Decision{Advertise, ReasonClusterReady, 1}},
		{"publishNotReadyAddresses applies to a slice without a managed-by label",
			Input{PublishNotReadyAddresses: true, Family: corev1.IPv4Protocol, Node: me,
				Slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
					s := v4(ep("10.0.0.2", "n2", notReady))
					s.Labels = nil
					return s
				}()}},
			Decision{Advertise, ReasonClusterReady, 1}},
		{"publishNotReadyAddresses leaves another manager's slice as written",
			Input{PublishNotReadyAddresses: true, Family: corev1.IPv4Protocol, Node: me,
				Slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
					s := v4(ep("10.0.0.2", "n2", notReady))
					s.Labels[discoveryv1.LabelManagedBy] = "endpointslicemirroring-controller.k8s.io"
					return s
				}()}},
			Decision{Withdraw, ReasonNone, 0}},

		// kube-proxy's EndpointSlice informer lists no slice labelled
		// headless, whatever its Service.
		{"a slice labelled headless is ignored",
			v4in(cluster, func() *discoveryv1.EndpointSlice {
				s := v4(ep("10.0.0.2", "n2", ready))
				s.Labels[LabelHeadless] = ""
				return s
			}(), v4(ep("10.0.0.3", "n3", termServing))),
			Decision{Drain, ReasonClusterTerminating, 1}},

		// Endpoints kube-proxy skips or does not count as local.
		{"an endpoint with no addresses is skipped",
			v4in(local, v4(discoveryv1.Endpoint{NodeName: new(me), Conditions: ready})),
			Decision{Withdraw, ReasonNone, 0}},
		{"an endpoint with nil NodeName is never local",
			v4in(local, v4(ep("10.0.0.1", "", ready))),
			Decision{Withdraw, ReasonNoLocal, 0}},
		{"an endpoint with nil NodeName still serves cluster policy",
			v4in(cluster, v4(ep("10.0.0.1", "", ready))),
			Decision{Advertise, ReasonClusterReady, 1}},
		{"an empty node name matches no endpoint",
			Input{Local: true, Family: corev1.IPv4Protocol, Slices: []*discoveryv1.EndpointSlice{
				v4(discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, NodeName: new(""), Conditions: ready})}},
			Decision{Withdraw, ReasonNoLocal, 0}},

		// Slices of other address types.
		{"an FQDN slice is ignored",
			v4in(cluster, slice(discoveryv1.AddressTypeFQDN, http, ep("example.com", "n2", ready))),
			Decision{Withdraw, ReasonNone, 0}},
		{"an IPv6 slice is ignored for an IPv4 address",
			v4in(local, slice(discoveryv1.AddressTypeIPv6, http, ep("fd00::1", me, ready)), v4(ep("10.0.0.2", "n2", ready))),
			Decision{Withdraw, ReasonNoLocal, 0}},
		{"an IPv4 slice is ignored for an IPv6 address",
			Input{Local: true, Family: corev1.IPv6Protocol, Node: me, Slices: []*discoveryv1.EndpointSlice{
				v4(ep("10.0.0.1", me, ready)),
				slice(discoveryv1.AddressTypeIPv6, http, ep("fd00::1", me, termServing))}},
			Decision{Drain, ReasonLocalTerminating, 1}},
		{"an unknown family matches no slice",
			Input{Family: "", Node: me, Slices: []*discoveryv1.EndpointSlice{v4(ep("10.0.0.1", me, ready))}},
			Decision{Withdraw, ReasonNone, 0}},

		// Duplicates: one endpoint per address:port, non-terminating wins.
		{"an address in two slices counts once",
			v4in(cluster, v4(ep("10.0.0.2", "n2", ready)), v4(ep("10.0.0.2", "n2", ready), ep("10.0.0.3", "n3", ready))),
			Decision{Advertise, ReasonClusterReady, 2}},
		{"an address spelled two ways counts once",
			Input{Family: corev1.IPv6Protocol, Node: me, Slices: []*discoveryv1.EndpointSlice{
				slice(discoveryv1.AddressTypeIPv6, http, ep("fd00::1", "n2", ready)),
				slice(discoveryv1.AddressTypeIPv6, http, ep("FD00:0::1", "n2", ready))}},
			Decision{Advertise, ReasonClusterReady, 1}},
		{"a non-terminating copy beats a terminating copy of the address",
			v4in(cluster, v4(ep("10.0.0.2", "n2", termServing)), v4(ep("10.0.0.2", "n2", ready))),
			Decision{Advertise, ReasonClusterReady, 1}},
		{"a reused IP: the running remote pod beats the local terminating one",
			v4in(local, v4(ep("10.0.0.2", me, termServing)), v4(ep("10.0.0.2", "n2", ready))),
			Decision{Withdraw, ReasonNoLocal, 0}},
		{"a reused IP: a not-ready running pod still beats a terminating serving one",
			v4in(cluster, v4(ep("10.0.0.2", me, termServing)), v4(ep("10.0.0.2", "n2", notReady))),
			Decision{Withdraw, ReasonNone, 0}},
		{"only an endpoint's first address counts",
			v4in(cluster, v4(discoveryv1.Endpoint{Addresses: []string{"10.0.0.2", "10.0.0.3"}, Conditions: ready}, ep("10.0.0.3", "n3", ready))),
			Decision{Advertise, ReasonClusterReady, 2}},

		// Ports: decided one by one, best state wins.
		{"two port sets where only one is usable advertise",
			v4in(local,
				slice(discoveryv1.AddressTypeIPv4, http, ep("10.0.0.1", me, notReady)),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("metrics", 9090)}, ep("10.0.0.3", me, ready))),
			Decision{Advertise, ReasonLocalReady, 1}},
		{"a draining port and a withdrawn port drain",
			v4in(cluster,
				slice(discoveryv1.AddressTypeIPv4, http, ep("10.0.0.1", me, termServing)),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("metrics", 9090)}, ep("10.0.0.3", "n3", notReady))),
			Decision{Drain, ReasonClusterTerminating, 1}},
		{"endpoints count distinct addresses over the ports at the best state",
			v4in(cluster,
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", 80), port("https", 443)},
					ep("10.0.0.1", me, ready), ep("10.0.0.2", "n2", ready)),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("https", 443)}, ep("10.0.0.3", "n3", ready)),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("metrics", 9090)}, ep("10.0.0.4", "n3", termServing))),
			Decision{Advertise, ReasonClusterReady, 3}},
		{"an address on two port numbers of one port counts once",
			v4in(cluster,
				slice(discoveryv1.AddressTypeIPv4, http, ep("10.0.0.2", "n2", ready)),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("http", 8080)}, ep("10.0.0.2", "n2", termServing))),
			Decision{Advertise, ReasonClusterReady, 1}},
		{"same port name, other protocol is another port",
			v4in(local,
				slice(discoveryv1.AddressTypeIPv4, http, ep("10.0.0.1", me, notReady)),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(80)), Protocol: new(corev1.ProtocolUDP)}},
					ep("10.0.0.3", me, termServing))),
			Decision{Drain, ReasonLocalTerminating, 1}},
		{"a withdrawn port with endpoints elsewhere names them",
			v4in(local,
				slice(discoveryv1.AddressTypeIPv4, http),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("metrics", 9090)}, ep("10.0.0.2", "n2", ready))),
			Decision{Withdraw, ReasonNoLocal, 0}},
		{"a port with nil protocol is TCP",
			v4in(cluster,
				slice(discoveryv1.AddressTypeIPv4, http, ep("10.0.0.2", "n2", ready)),
				slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(80))}}, ep("10.0.0.3", "n3", ready))),
			Decision{Advertise, ReasonClusterReady, 2}},
		{"ports with no name, no number or number 0 are skipped",
			v4in(cluster, slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				{Port: new(int32(80))}, {Name: new("a")}, {Name: new("b"), Port: new(int32(0))}}, ep("10.0.0.2", "n2", ready))),
			Decision{Withdraw, ReasonNone, 0}},
		{"a slice without ports delivers nothing",
			v4in(cluster, slice(discoveryv1.AddressTypeIPv4, nil, ep("10.0.0.2", "n2", ready))),
			Decision{Withdraw, ReasonNone, 0}},

		// Topology does not change external delivery.
		{"topology hints for another zone do not matter",
			v4in(cluster, v4(func() discoveryv1.Endpoint {
				e := ep("10.0.0.2", "n2", ready)
				e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "elsewhere"}}, ForNodes: []discoveryv1.ForNode{{Name: "n2"}}}
				return e
			}())),
			Decision{Advertise, ReasonClusterReady, 1}},

		{"no slices withdraw", v4in(local), Decision{Withdraw, ReasonNone, 0}},
		{"a nil slice is skipped", v4in(cluster, nil, v4(ep("10.0.0.2", "n2", ready))), Decision{Advertise, ReasonClusterReady, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(tc.in); got != tc.want {
				t.Errorf("Decide = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Withdraw: "withdraw", Drain: "drain", Advertise: "advertise", 7: "unknown"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

func TestDecideDoesNotMutate(t *testing.T) {
	in := Input{Local: true, PublishNotReadyAddresses: true, Family: corev1.IPv4Protocol, Node: me, Slices: []*discoveryv1.EndpointSlice{
		v4(ep("10.0.0.2", me, termServing), ep("10.0.0.1", "n2", discoveryv1.EndpointConditions{}), discoveryv1.Endpoint{}),
		v4(ep("10.0.0.2", "n2", ready)),
		slice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: new("x"), Port: new(int32(1))}}, ep("10.0.0.3", me, termGone)),
		slice(discoveryv1.AddressTypeIPv6, http, ep("fd00::1", me, ready)),
		nil,
	}}
	want := deepCopy(in)
	Decide(in)
	if !reflect.DeepEqual(in, want) {
		t.Errorf("Decide changed its input:\n got %+v\nwant %+v", in, want)
	}
}

func deepCopy(in Input) Input {
	out := in
	out.Slices = slices.Clone(in.Slices) // keeps nil nil
	for i, s := range out.Slices {
		out.Slices[i] = s.DeepCopy()
	}
	return out
}

// TestProperties checks invariants on random inputs: Withdraw exactly when
// no endpoint is counted; Local only delivers with an endpoint on this node;
// Cluster policy never delivers less than Local; the reason fits the state
// and policy; the answer does not depend on slice or endpoint order; the
// input is left alone. FLOCK_SEED=<n> repeats a run.
func TestProperties(t *testing.T) {
	seed := testutil.Seed(t)
	rounds := 20000
	if testing.Short() {
		rounds = 2000
	}
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	reasons := map[bool]map[State][]Reason{
		true:  {Advertise: {ReasonLocalReady}, Drain: {ReasonLocalTerminating}, Withdraw: {ReasonNoLocal, ReasonNone}},
		false: {Advertise: {ReasonClusterReady}, Drain: {ReasonClusterTerminating}, Withdraw: {ReasonNone}},
	}
	seen := map[Decision]bool{}
	for i := range rounds {
		in := randomInput(r)
		orig := deepCopy(in)
		got := Decide(in)
		seen[got] = true
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("round %d: %+v for %s: "+format, append([]any{i, got, describe(in)}, args...)...)
		}
		if !reflect.DeepEqual(in, orig) {
			fail("input changed")
		}
		if (got.State == Withdraw) != (got.Endpoints == 0) {
			fail("Withdraw must go with 0 endpoints and only with it")
		}
		if got.State != Withdraw && got.Endpoints > distinctAddrs(in) {
			fail("more endpoints than addresses (%d)", distinctAddrs(in))
		}
		if !slices.Contains(reasons[in.Local][got.State], got.Reason) {
			fail("reason does not fit state and policy")
		}
		if in.Local && got.State != Withdraw && !hasLocal(in) {
			fail("Local delivers without an endpoint on this node")
		}
		other := in
		other.Local = !in.Local
		if o := Decide(other); (in.Local && o.State < got.State) || (!in.Local && o.State > got.State) {
			fail("Cluster delivers less than Local (%+v)", o)
		}
		shuffled := deepCopy(in)
		r.Shuffle(len(shuffled.Slices), func(a, b int) { shuffled.Slices[a], shuffled.Slices[b] = shuffled.Slices[b], shuffled.Slices[a] })
		for _, s := range shuffled.Slices {
			if s != nil {
				r.Shuffle(len(s.Endpoints), func(a, b int) { s.Endpoints[a], s.Endpoints[b] = s.Endpoints[b], s.Endpoints[a] })
			}
		}
		if s := Decide(shuffled); s != got {
			fail("reordered slices give %+v", s)
		}
	}
	// The generator must reach every state, or the checks above prove little.
	for _, st := range []State{Withdraw, Drain, Advertise} {
		found := false
		for d := range seen {
			found = found || d.State == st
		}
		if !found {
			t.Errorf("no input gave %v", st)
		}
	}
}

func randomInput(r *rand.Rand) Input {
	pick := func(v ...string) string { return v[r.IntN(len(v))] }
	cond := func() *bool {
		switch r.IntN(3) {
		case 0:
			return nil
		case 1:
			return new(true)
		}
		return new(false)
	}
	in := Input{
		Local:                    r.IntN(2) == 0,
		PublishNotReadyAddresses: r.IntN(5) == 0,
		Family:                   []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv4Protocol, corev1.IPv6Protocol, ""}[r.IntN(4)],
		Node:                     pick(me, me, me, ""),
	}
	for range r.IntN(5) {
		if r.IntN(20) == 0 {
			in.Slices = append(in.Slices, nil)
			continue
		}
		at := []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN}[r.IntN(3)]
		var ports []discoveryv1.EndpointPort
		for range r.IntN(3) {
			p := port(pick("http", "https", ""), []int32{80, 80, 8080, 0}[r.IntN(4)])
			switch r.IntN(12) {
			case 0:
				p.Name = nil
			case 1:
				p.Port = nil
			case 2:
				p.Protocol = nil
			}
			ports = append(ports, p)
		}
		s := slice(at, ports)
		switch r.IntN(4) {
		case 0:
			s.Labels = nil
		case 1:
			s.Labels[discoveryv1.LabelManagedBy] = "someone-else"
		}
		for range r.IntN(5) {
			var addrs []string
			if r.IntN(10) != 0 {
				addrs = []string{pick("10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2", "FD00::2")}
			}
			e := discoveryv1.Endpoint{Addresses: addrs,
				Conditions: discoveryv1.EndpointConditions{Ready: cond(), Serving: cond(), Terminating: cond()}}
			if r.IntN(6) != 0 {
				e.NodeName = new(pick(me, "n2", "n3", ""))
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		in.Slices = append(in.Slices, s)
	}
	return in
}

// describe prints an input for a failure message.
func describe(in Input) string {
	s := "Local=" + strconv.FormatBool(in.Local) + " PNRA=" + strconv.FormatBool(in.PublishNotReadyAddresses) +
		" Family=" + string(in.Family) + " Node=" + in.Node
	for _, sl := range in.Slices {
		if sl == nil {
			s += "\n  <nil>"
			continue
		}
		s += "\n  " + string(sl.AddressType) + " managed-by=" + sl.Labels[discoveryv1.LabelManagedBy] + " ports="
		for _, p := range sl.Ports {
			s += "[" + str(p.Name) + " " + num(p.Port) + " " + str((*string)(p.Protocol)) + "]"
		}
		for _, e := range sl.Endpoints {
			s += "\n    " + strconv.Quote(strings.Join(e.Addresses, ",")) + " node=" + str(e.NodeName) + " ready=" + boolp(e.Conditions.Ready) +
				" serving=" + boolp(e.Conditions.Serving) + " terminating=" + boolp(e.Conditions.Terminating)
		}
	}
	return s
}

func str(p *string) string {
	if p == nil {
		return "nil"
	}
	return strconv.Quote(*p)
}

func num(p *int32) string {
	if p == nil {
		return "nil"
	}
	return strconv.Itoa(int(*p))
}

func boolp(p *bool) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatBool(*p)
}

// hasLocal: some slice of the address's family lists an endpoint on this node.
func hasLocal(in Input) bool {
	for _, s := range in.Slices {
		if s == nil || string(s.AddressType) != string(in.Family) {
			continue
		}
		for _, e := range s.Endpoints {
			if in.Node != "" && e.NodeName != nil && *e.NodeName == in.Node && len(e.Addresses) > 0 {
				return true
			}
		}
	}
	return false
}

// distinctAddrs counts first addresses (as written) in the family's slices,
// an upper bound on what Decide may count.
func distinctAddrs(in Input) int {
	seen := map[string]bool{}
	for _, s := range in.Slices {
		if s == nil || string(s.AddressType) != string(in.Family) {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) > 0 {
				seen[e.Addresses[0]] = true
			}
		}
	}
	return len(seen)
}

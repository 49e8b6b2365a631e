package annotations_test

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/ipam"
)

func mustAlgo(t *testing.T, s string) ipam.Algo {
	t.Helper()
	a, err := ipam.ParseAlgo(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestKeys(t *testing.T) {
	want := []string{
		annotations.Addresses, annotations.Anycast, annotations.CIDR4, annotations.CIDR6,
		annotations.IPAlgo, annotations.IPv4, annotations.IPv6,
	}
	got := annotations.Keys()
	if !slices.Equal(got, want) {
		t.Errorf("Keys() = %v, want %v", got, want)
	}
	for _, k := range got {
		if !strings.HasPrefix(k, annotations.Prefix) {
			t.Errorf("key %q lacks prefix %q", k, annotations.Prefix)
		}
	}
}

func TestParseGood(t *testing.T) {
	v6only := annotations.Defaults{IPv6: true, IPv4: false, Algo: ipam.Algo{Kind: ipam.Random}}
	dual := annotations.Defaults{IPv6: true, IPv4: true, Algo: ipam.Algo{Kind: ipam.Random}}
	tests := []struct {
		name string
		ann  map[string]string
		d    annotations.Defaults
		want annotations.Request
	}{
		{
			name: "nil annotations keep defaults",
			ann:  nil,
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "non-flock keys ignored",
			ann: map[string]string{
				"kubernetes.io/psp":                   "x",
				"flock.fritzlab.net":                  "no slash, not ours",
				"other.example.com/ipv4":              "maybe",
				"example.com/flock.fritzlab.net/ipv4": "not a prefix match",
			},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "ipv6 true",
			ann:  map[string]string{annotations.IPv6: "true"},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "ipv4 true overrides default false",
			ann:  map[string]string{annotations.IPv4: "true"},
			d:    v6only,
			want: annotations.Request{IPv6: true, IPv4: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "ipv4 false overrides default true",
			ann:  map[string]string{annotations.IPv4: "false"},
			d:    dual,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "ipv6 false with ipv4 true",
			ann:  map[string]string{annotations.IPv6: "false", annotations.IPv4: "true"},
			d:    v6only,
			want: annotations.Request{IPv4: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "ipv6 false with ipv4 from defaults",
			ann:  map[string]string{annotations.IPv6: "false"},
			d:    dual,
			want: annotations.Request{IPv4: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "cidr6",
			ann:  map[string]string{annotations.CIDR6: "2001:db8:100::/120"},
			d:    v6only,
			want: annotations.Request{IPv6: true, CIDR6: netip.MustParsePrefix("2001:db8:100::/120"), Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "cidr4",
			ann:  map[string]string{annotations.CIDR4: "10.1.1.0/28"},
			d:    dual,
			want: annotations.Request{IPv6: true, IPv4: true, CIDR4: netip.MustParsePrefix("10.1.1.0/28"), Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "cidr4 with ipv4 turned on by annotation",
			ann:  map[string]string{annotations.CIDR4: "10.1.1.0/28", annotations.IPv4: "true"},
			d:    v6only,
			want: annotations.Request{IPv6: true, IPv4: true, CIDR4: netip.MustParsePrefix("10.1.1.0/28"), Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "single-address cidr6",
			ann:  map[string]string{annotations.CIDR6: "2001:db8::5/128"},
			d:    v6only,
			want: annotations.Request{IPv6: true, CIDR6: netip.MustParsePrefix("2001:db8::5/128"), Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "ip-algo sequential overrides default",
			ann:  map[string]string{annotations.IPAlgo: "sequential"},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Sequential}},
		},
		{
			name: "ip-algo random overrides default sequential",
			ann:  map[string]string{annotations.IPAlgo: "random"},
			d:    annotations.Defaults{IPv6: true, Algo: ipam.Algo{Kind: ipam.Sequential}},
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}},
		},
		{
			name: "absent ip-algo keeps default",
			ann:  map[string]string{annotations.IPv6: "true"},
			d:    annotations.Defaults{IPv6: true, Algo: ipam.Algo{Kind: ipam.Sequential}},
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Sequential}},
		},
		{
			name: "ip-algo embed",
			ann:  map[string]string{annotations.IPAlgo: "embed"},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: mustAlgo(t, "embed")},
		},
		{
			name: "ip-algo embed with layout",
			ann:  map[string]string{annotations.IPAlgo: "embed:ns/4,app/12"},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Embed, Layout: []ipam.Field{{Name: "ns", Bits: 4}, {Name: "app", Bits: 12}}}},
		},
		{
			name: "anycast one IPv6",
			ann:  map[string]string{annotations.Anycast: "2001:db8:ff::1"},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}, Anycast: addrs("2001:db8:ff::1")},
		},
		{
			name: "anycast both families with spaces, order kept",
			ann:  map[string]string{annotations.Anycast: " 2001:db8:ff::2 , 192.0.2.10,2001:db8:ff::1"},
			d:    dual,
			want: annotations.Request{IPv6: true, IPv4: true, Algo: ipam.Algo{Kind: ipam.Random}, Anycast: addrs("2001:db8:ff::2", "192.0.2.10", "2001:db8:ff::1")},
		},
		{
			name: "addresses",
			ann:  map[string]string{annotations.Addresses: "2001:db8:aa::1,2001:db8:aa::2"},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}, Addresses: addrs("2001:db8:aa::1", "2001:db8:aa::2")},
		},
		{
			name: "IPv4 addresses when ipv4 on by default",
			ann:  map[string]string{annotations.Addresses: "198.51.100.7"},
			d:    dual,
			want: annotations.Request{IPv6: true, IPv4: true, Algo: ipam.Algo{Kind: ipam.Random}, Addresses: addrs("198.51.100.7")},
		},
		{
			name: "anycast and addresses together",
			ann: map[string]string{
				annotations.Anycast:   "2001:db8:ff::1",
				annotations.Addresses: "2001:db8:aa::1",
			},
			d:    v6only,
			want: annotations.Request{IPv6: true, Algo: ipam.Algo{Kind: ipam.Random}, Anycast: addrs("2001:db8:ff::1"), Addresses: addrs("2001:db8:aa::1")},
		},
		{
			name: "every key at once",
			ann: map[string]string{
				annotations.IPv6:      "true",
				annotations.IPv4:      "true",
				annotations.CIDR6:     "2001:db8:100::/120",
				annotations.CIDR4:     "10.1.1.0/24",
				annotations.IPAlgo:    "sequential",
				annotations.Anycast:   "2001:db8:ff::1,192.0.2.1",
				annotations.Addresses: "2001:db8:aa::1,198.51.100.1",
				"app":                 "web",
			},
			d: annotations.Defaults{},
			want: annotations.Request{
				IPv6: true, IPv4: true,
				CIDR6:     netip.MustParsePrefix("2001:db8:100::/120"),
				CIDR4:     netip.MustParsePrefix("10.1.1.0/24"),
				Algo:      ipam.Algo{Kind: ipam.Sequential},
				Anycast:   addrs("2001:db8:ff::1", "192.0.2.1"),
				Addresses: addrs("2001:db8:aa::1", "198.51.100.1"),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := annotations.Parse(tc.ann, tc.d)
			if err != nil {
				t.Fatalf("Parse(%v): %v", tc.ann, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Parse(%v)\n got %+v\nwant %+v", tc.ann, got, tc.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	v6only := annotations.Defaults{IPv6: true}
	dual := annotations.Defaults{IPv6: true, IPv4: true}
	tests := []struct {
		name    string
		ann     map[string]string
		d       annotations.Defaults
		key     string // the key the error must name
		value   string // the offending value the error must contain
		reason  string // a substring of the reason, optional
		errText string // another substring of the full message, optional
	}{
		// Booleans.
		{name: "ipv6 yes", ann: map[string]string{annotations.IPv6: "yes"}, d: v6only, key: annotations.IPv6, value: "yes", reason: `"true" or "false"`},
		{name: "ipv6 1", ann: map[string]string{annotations.IPv6: "1"}, d: v6only, key: annotations.IPv6, value: "1"},
		{name: "ipv6 TRUE", ann: map[string]string{annotations.IPv6: "TRUE"}, d: v6only, key: annotations.IPv6, value: "TRUE"},
		{name: "ipv6 empty", ann: map[string]string{annotations.IPv6: ""}, d: v6only, key: annotations.IPv6, value: ""},
		{name: "ipv6 padded", ann: map[string]string{annotations.IPv6: " true"}, d: v6only, key: annotations.IPv6, value: " true"},
		{name: "ipv4 yes", ann: map[string]string{annotations.IPv4: "yes"}, d: v6only, key: annotations.IPv4, value: "yes"},
		{name: "ipv4 1", ann: map[string]string{annotations.IPv4: "1"}, d: v6only, key: annotations.IPv4, value: "1"},
		{name: "ipv4 TRUE", ann: map[string]string{annotations.IPv4: "TRUE"}, d: v6only, key: annotations.IPv4, value: "TRUE"},
		{name: "ipv4 False", ann: map[string]string{annotations.IPv4: "False"}, d: v6only, key: annotations.IPv4, value: "False"},
		{name: "ipv4 empty", ann: map[string]string{annotations.IPv4: ""}, d: v6only, key: annotations.IPv4, value: ""},

		// CIDRs.
		{name: "cidr6 garbage", ann: map[string]string{annotations.CIDR6: "not-a-cidr"}, d: v6only, key: annotations.CIDR6, value: "not-a-cidr", reason: "not a CIDR"},
		{name: "cidr6 bare address", ann: map[string]string{annotations.CIDR6: "2001:db8::1"}, d: v6only, key: annotations.CIDR6, value: "2001:db8::1", reason: "not a CIDR"},
		{name: "cidr6 prefix too long", ann: map[string]string{annotations.CIDR6: "2001:db8::/129"}, d: v6only, key: annotations.CIDR6, value: "2001:db8::/129", reason: "not a CIDR"},
		{name: "cidr6 empty", ann: map[string]string{annotations.CIDR6: ""}, d: v6only, key: annotations.CIDR6, value: "", reason: "not a CIDR"},
		{name: "cidr4 garbage", ann: map[string]string{annotations.CIDR4: "10.0.0.0/33"}, d: dual, key: annotations.CIDR4, value: "10.0.0.0/33", reason: "not a CIDR"},
		{name: "cidr6 given IPv4", ann: map[string]string{annotations.CIDR6: "10.1.1.0/24"}, d: dual, key: annotations.CIDR6, value: "10.1.1.0/24", reason: "not an IPv6 CIDR"},
		{name: "cidr4 given IPv6", ann: map[string]string{annotations.CIDR4: "fd00:10:1::/64"}, d: dual, key: annotations.CIDR4, value: "fd00:10:1::/64", reason: "not an IPv4 CIDR"},
		{name: "cidr6 given IPv4-mapped", ann: map[string]string{annotations.CIDR6: "::ffff:10.1.1.0/120"}, d: dual, key: annotations.CIDR6, value: "::ffff:10.1.1.0/120", reason: "not an IPv6 CIDR"},
		{name: "cidr4 given IPv4-mapped", ann: map[string]string{annotations.CIDR4: "::ffff:10.1.1.0/120"}, d: dual, key: annotations.CIDR4, value: "::ffff:10.1.1.0/120", reason: "not an IPv4 CIDR"},
		{name: "cidr6 host bits", ann: map[string]string{annotations.CIDR6: "2001:db8:100::5/120"}, d: v6only, key: annotations.CIDR6, value: "2001:db8:100::5/120", reason: "did you mean 2001:db8:100::/120?"},
		{name: "cidr4 host bits", ann: map[string]string{annotations.CIDR4: "10.1.1.7/24"}, d: dual, key: annotations.CIDR4, value: "10.1.1.7/24", reason: "did you mean 10.1.1.0/24?"},

		// ip-algo.
		{name: "ip-algo bogus", ann: map[string]string{annotations.IPAlgo: "bogus"}, d: v6only, key: annotations.IPAlgo, value: "bogus", reason: "unknown algorithm"},
		{name: "ip-algo empty", ann: map[string]string{annotations.IPAlgo: ""}, d: v6only, key: annotations.IPAlgo, value: ""},
		{name: "ip-algo uppercase", ann: map[string]string{annotations.IPAlgo: "Random"}, d: v6only, key: annotations.IPAlgo, value: "Random"},
		{name: "ip-algo embed unknown field", ann: map[string]string{annotations.IPAlgo: "embed:foo/8"}, d: v6only, key: annotations.IPAlgo, value: "embed:foo/8", reason: `unknown field "foo"`},
		{name: "ip-algo embed too many bits", ann: map[string]string{annotations.IPAlgo: "embed:ns/99"}, d: v6only, key: annotations.IPAlgo, value: "embed:ns/99", reason: "out of range"},
		{name: "ip-algo embed empty list", ann: map[string]string{annotations.IPAlgo: "embed:"}, d: v6only, key: annotations.IPAlgo, value: "embed:"},
		{name: "ip-algo embed duplicate field", ann: map[string]string{annotations.IPAlgo: "embed:ns/8,ns/8"}, d: v6only, key: annotations.IPAlgo, value: "embed:ns/8,ns/8", reason: "duplicate"},

		// anycast / addresses values.
		{name: "anycast non-IP", ann: map[string]string{annotations.Anycast: "2001:db8:ff::1,banana"}, d: v6only, key: annotations.Anycast, value: "banana", reason: "not an IP address"},
		{name: "anycast CIDR", ann: map[string]string{annotations.Anycast: "2001:db8:ff::/64"}, d: v6only, key: annotations.Anycast, value: "2001:db8:ff::/64", reason: "not an IP address"},
		{name: "anycast empty", ann: map[string]string{annotations.Anycast: ""}, d: v6only, key: annotations.Anycast, value: "", reason: "not an IP address"},
		{name: "anycast trailing comma", ann: map[string]string{annotations.Anycast: "2001:db8:ff::1,"}, d: v6only, key: annotations.Anycast, value: "2001:db8:ff::1,", reason: "not an IP address"},
		{name: "anycast zone", ann: map[string]string{annotations.Anycast: "2001:db8:ff::1%eth0"}, d: v6only, key: annotations.Anycast, value: "2001:db8:ff::1%eth0", reason: "zones"},
		{name: "anycast IPv4-mapped", ann: map[string]string{annotations.Anycast: "::ffff:192.0.2.1"}, d: dual, key: annotations.Anycast, value: "::ffff:192.0.2.1", reason: "IPv4-mapped"},
		{name: "anycast duplicate", ann: map[string]string{annotations.Anycast: "2001:db8:ff::1,2001:db8:ff::1"}, d: v6only, key: annotations.Anycast, value: "2001:db8:ff::1", reason: "listed twice"},
		{name: "anycast duplicate different spelling", ann: map[string]string{annotations.Anycast: "2001:db8:ff::1, 2001:0db8:00ff:0:0:0:0:1"}, d: v6only, key: annotations.Anycast, value: "2001:0db8:00ff:0:0:0:0:1", reason: "2001:db8:ff::1 is listed twice"},
		{name: "anycast link-local", ann: map[string]string{annotations.Anycast: "fe80::1"}, d: v6only, key: annotations.Anycast, value: "fe80::1", reason: "not a global unicast"},
		{name: "anycast IPv4 link-local", ann: map[string]string{annotations.Anycast: "169.254.1.1"}, d: dual, key: annotations.Anycast, value: "169.254.1.1", reason: "not a global unicast"},
		{name: "anycast multicast", ann: map[string]string{annotations.Anycast: "ff02::1"}, d: v6only, key: annotations.Anycast, value: "ff02::1", reason: "not a global unicast"},
		{name: "anycast IPv4 multicast", ann: map[string]string{annotations.Anycast: "224.0.0.5"}, d: dual, key: annotations.Anycast, value: "224.0.0.5", reason: "not a global unicast"},
		{name: "anycast loopback", ann: map[string]string{annotations.Anycast: "::1"}, d: v6only, key: annotations.Anycast, value: "::1", reason: "not a global unicast"},
		{name: "anycast IPv4 loopback", ann: map[string]string{annotations.Anycast: "127.0.0.1"}, d: dual, key: annotations.Anycast, value: "127.0.0.1", reason: "not a global unicast"},
		{name: "anycast unspecified", ann: map[string]string{annotations.Anycast: "::"}, d: v6only, key: annotations.Anycast, value: "::", reason: "not a global unicast"},
		{name: "anycast IPv4 broadcast", ann: map[string]string{annotations.Anycast: "255.255.255.255"}, d: dual, key: annotations.Anycast, value: "255.255.255.255", reason: "not a global unicast"},
		{name: "anycast IPv4 with ipv4=false", ann: map[string]string{annotations.Anycast: "192.0.2.1", annotations.IPv4: "false"}, d: dual, key: annotations.Anycast, value: "192.0.2.1", reason: "family is off"},
		{name: "anycast IPv4 with ipv4 default off", ann: map[string]string{annotations.Anycast: "2001:db8:ff::1,192.0.2.1"}, d: v6only, key: annotations.Anycast, value: "192.0.2.1", reason: "family is off"},
		{name: "anycast IPv6 with ipv6=false", ann: map[string]string{annotations.Anycast: "2001:db8:ff::1", annotations.IPv6: "false"}, d: dual, key: annotations.Anycast, value: "2001:db8:ff::1", reason: "family is off"},
		{name: "addresses non-IP", ann: map[string]string{annotations.Addresses: "example.com"}, d: v6only, key: annotations.Addresses, value: "example.com", reason: "not an IP address"},
		{name: "addresses zone", ann: map[string]string{annotations.Addresses: "2001:db8:aa::1%1"}, d: v6only, key: annotations.Addresses, value: "2001:db8:aa::1%1", reason: "zones"},
		{name: "addresses duplicate", ann: map[string]string{annotations.Addresses: "198.51.100.1,198.51.100.1"}, d: dual, key: annotations.Addresses, value: "198.51.100.1", reason: "listed twice"},
		{name: "addresses link-local", ann: map[string]string{annotations.Addresses: "fe80::abcd"}, d: v6only, key: annotations.Addresses, value: "fe80::abcd", reason: "not a global unicast"},
		{name: "addresses multicast", ann: map[string]string{annotations.Addresses: "ff05::2"}, d: v6only, key: annotations.Addresses, value: "ff05::2", reason: "not a global unicast"},
		{name: "addresses loopback", ann: map[string]string{annotations.Addresses: "127.0.0.2"}, d: dual, key: annotations.Addresses, value: "127.0.0.2", reason: "not a global unicast"},
		{name: "addresses IPv4 with ipv4=false", ann: map[string]string{annotations.Addresses: "198.51.100.1", annotations.IPv4: "false"}, d: dual, key: annotations.Addresses, value: "198.51.100.1", reason: "family is off"},
		{
			name:   "same IP in anycast and addresses",
			ann:    map[string]string{annotations.Anycast: "2001:db8:ff::1", annotations.Addresses: "2001:db8:ff::1"},
			d:      v6only,
			key:    annotations.Addresses,
			value:  "2001:db8:ff::1",
			reason: "also in " + annotations.Anycast,
		},

		// Cross-key consistency.
		{name: "cidr6 with ipv6=false", ann: map[string]string{annotations.CIDR6: "2001:db8:100::/120", annotations.IPv6: "false"}, d: dual, key: annotations.CIDR6, value: "2001:db8:100::/120", reason: "ipv6=false"},
		{name: "cidr4 with ipv4 default off", ann: map[string]string{annotations.CIDR4: "10.1.1.0/24"}, d: v6only, key: annotations.CIDR4, value: "10.1.1.0/24", reason: "ipv4 is false"},
		{name: "cidr4 with ipv4=false", ann: map[string]string{annotations.CIDR4: "10.1.1.0/24", annotations.IPv4: "false"}, d: dual, key: annotations.CIDR4, value: "10.1.1.0/24", reason: "ipv4 is false"},
		{name: "both families off by annotation", ann: map[string]string{annotations.IPv6: "false", annotations.IPv4: "false"}, d: dual, key: annotations.IPv6, value: "false", reason: "no address at all"},
		{name: "ipv6 off, ipv4 default off", ann: map[string]string{annotations.IPv6: "false"}, d: v6only, key: annotations.IPv6, value: "false", reason: "no address at all"},

		// Unknown keys.
		{name: "unknown key ipv44", ann: map[string]string{"flock.fritzlab.net/ipv44": "true"}, d: v6only, key: "flock.fritzlab.net/ipv44", value: "true", reason: "unknown flock annotation", errText: annotations.IPv4},
		{name: "unknown key bare prefix", ann: map[string]string{annotations.Prefix: "x"}, d: v6only, key: annotations.Prefix, value: "x", reason: "unknown flock annotation"},
		{name: "unknown key case", ann: map[string]string{"flock.fritzlab.net/IPv6": "true"}, d: v6only, key: "flock.fritzlab.net/IPv6", value: "true", reason: "unknown flock annotation"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := annotations.Parse(tc.ann, tc.d)
			if err == nil {
				t.Fatalf("Parse(%v) = %+v, want error", tc.ann, got)
			}
			var ae *annotations.Error
			if !errors.As(err, &ae) {
				t.Fatalf("Parse(%v) error %v (%T) is not an *annotations.Error", tc.ann, err, err)
			}
			if !reflect.DeepEqual(got, annotations.Request{}) {
				t.Errorf("on error Parse returned a non-zero request %+v", got)
			}
			if ae.Key != tc.key {
				t.Errorf("Error.Key = %q, want %q", ae.Key, tc.key)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.key) {
				t.Errorf("error %q does not name key %q", msg, tc.key)
			}
			// The value appears verbatim; an empty value shows as "".
			wantVal := tc.value
			if wantVal == "" {
				wantVal = `""`
			}
			if !strings.Contains(msg, wantVal) {
				t.Errorf("error %q does not contain the offending value %q", msg, tc.value)
			}
			if !strings.Contains(ae.Value, tc.value) {
				t.Errorf("Error.Value = %q, does not contain %q", ae.Value, tc.value)
			}
			if tc.reason != "" && !strings.Contains(ae.Reason, tc.reason) {
				t.Errorf("Error.Reason = %q, want it to contain %q", ae.Reason, tc.reason)
			}
			if tc.errText != "" && !strings.Contains(msg, tc.errText) {
				t.Errorf("error %q does not contain %q", msg, tc.errText)
			}
		})
	}
}

// With several bad keys the reported one does not depend on map order.
func TestParseErrorDeterministic(t *testing.T) {
	ann := map[string]string{
		annotations.IPv6:         "yes",
		annotations.IPv4:         "no",
		annotations.CIDR6:        "x",
		annotations.Anycast:      "y",
		"flock.fritzlab.net/zzz": "1",
	}
	var first string
	for i := 0; i < 50; i++ {
		_, err := annotations.Parse(ann, annotations.Defaults{IPv6: true})
		if err == nil {
			t.Fatal("no error")
		}
		if i == 0 {
			first = err.Error()
			continue
		}
		if err.Error() != first {
			t.Fatalf("error changed between runs: %q vs %q", first, err.Error())
		}
	}
	// Keys are checked in sorted order: addresses < anycast < cidr6 < ...
	if !strings.Contains(first, annotations.Anycast) {
		t.Errorf("error %q: want the first bad key in sorted order (%s)", first, annotations.Anycast)
	}
}

func TestErrorFormat(t *testing.T) {
	e := &annotations.Error{Key: annotations.IPv4, Value: "yes", Reason: "want a boolean"}
	want := `annotation flock.fritzlab.net/ipv4="yes": want a boolean`
	if e.Error() != want {
		t.Errorf("Error() = %q, want %q", e.Error(), want)
	}
}

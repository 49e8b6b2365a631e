package annotations_test

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/agent/annotations"
	"code.fritzlab.net/fritzlab/flock/ipam"
)

// fuzzKeys are the keys FuzzParse's present bits switch on, in order.
var fuzzKeys = []string{
	annotations.IPv6, annotations.IPv4, annotations.CIDR6, annotations.CIDR4,
	annotations.IPAlgo, annotations.Anycast, annotations.Addresses,
}

// FuzzParse builds annotations from a bit mask (which of the seven keys are
// set), their values and one more key of any name. Parse either fails with
// an *annotations.Error that names a flock annotation key (one of the pod's
// or, when no family is left, ipv6) and its value, and returns a zero
// request; or it returns a request whose values are valid: at least one
// family, cidr6/cidr4 of their family, masked and with that family on,
// anycast and addresses global unicast without zones or mapped forms, of a
// family that is on, never listed twice; each value is the one annotated
// (or the default). Keys without the flock prefix change nothing.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, present uint8, ipv6, ipv4, cidr6, cidr4, algo, anycast, addresses, otherKey, otherVal string, d6, d4 bool, dAlgo string) {
		ann := map[string]string{}
		for i, v := range []string{ipv6, ipv4, cidr6, cidr4, algo, anycast, addresses} {
			if present&(1<<i) != 0 {
				ann[fuzzKeys[i]] = v
			}
		}
		if otherKey != "" {
			ann[otherKey] = otherVal
		}
		d := annotations.Defaults{IPv6: d6, IPv4: d4}
		if a, err := ipam.ParseAlgo(dAlgo); err == nil {
			d.Algo = a
		}

		r, err := annotations.Parse(ann, d)

		// Other keys are ignored: adding one changes nothing.
		withForeign := map[string]string{"kubernetes.io/config.seen": "x", "flock.fritzlab.net": "not ours", "": ""}
		for k, v := range ann {
			withForeign[k] = v
		}
		r2, err2 := annotations.Parse(withForeign, d)
		if !reflect.DeepEqual(r, r2) || (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("foreign keys changed the result: %+v, %v vs %+v, %v", r, err, r2, err2)
		}

		if err != nil {
			var ae *annotations.Error
			if !errors.As(err, &ae) {
				t.Fatalf("Parse(%q) error %v (%T) is not an *annotations.Error", ann, err, err)
			}
			if !reflect.DeepEqual(r, annotations.Request{}) {
				t.Fatalf("Parse(%q) returned %+v with error %v", ann, r, err)
			}
			if !strings.HasPrefix(ae.Key, annotations.Prefix) || !strings.Contains(err.Error(), ae.Key) {
				t.Fatalf("Parse(%q) error %q names no flock annotation key (Key %q)", ann, err, ae.Key)
			}
			v, ok := ann[ae.Key]
			if !ok && ae.Key != annotations.IPv6 {
				t.Fatalf("Parse(%q) error %q names the key %q the pod does not have", ann, err, ae.Key)
			}
			if ae.Value != v {
				t.Fatalf("Parse(%q) error %q: Value %q, want the annotation's %q", ann, err, ae.Value, v)
			}
			return
		}

		if !r.IPv6 && !r.IPv4 {
			t.Fatalf("Parse(%q) = %+v: no family", ann, r)
		}
		checkBool := func(key string, got, def bool) {
			v, ok := ann[key]
			if (ok && got != (v == "true")) || (ok && v != "true" && v != "false") || (!ok && got != def) {
				t.Fatalf("Parse(%q): %s = %v (default %v)", ann, key, got, def)
			}
		}
		checkBool(annotations.IPv6, r.IPv6, d.IPv6)
		checkBool(annotations.IPv4, r.IPv4, d.IPv4)
		checkCIDR := func(key string, p netip.Prefix, is4, on bool) {
			v, ok := ann[key]
			if !ok {
				if p.IsValid() {
					t.Fatalf("Parse(%q): %s = %s without the annotation", ann, key, p)
				}
				return
			}
			if !p.IsValid() || p.Masked() != p || p.Addr().Is4() != is4 || p.Addr().Is4In6() || p.Addr().Zone() != "" || !on {
				t.Fatalf("Parse(%q): %s = %s (family on: %v)", ann, key, p, on)
			}
			if want, err := netip.ParsePrefix(v); err != nil || want != p {
				t.Fatalf("Parse(%q): %s = %s, not the annotation's %q", ann, key, p, v)
			}
		}
		checkCIDR(annotations.CIDR6, r.CIDR6, false, r.IPv6)
		checkCIDR(annotations.CIDR4, r.CIDR4, true, r.IPv4)

		wantAlgo := d.Algo
		if v, ok := ann[annotations.IPAlgo]; ok {
			a, err := ipam.ParseAlgo(v)
			if err != nil {
				t.Fatalf("Parse(%q) accepted the ip-algo %q: %v", ann, v, err)
			}
			wantAlgo = a
		}
		if !reflect.DeepEqual(r.Algo, wantAlgo) {
			t.Fatalf("Parse(%q): algo %+v, want %+v", ann, r.Algo, wantAlgo)
		}

		seen := map[netip.Addr]bool{}
		for _, set := range []struct {
			key string
			ips []netip.Addr
		}{{annotations.Anycast, r.Anycast}, {annotations.Addresses, r.Addresses}} {
			v, ok := ann[set.key]
			if !ok {
				if set.ips != nil {
					t.Fatalf("Parse(%q): %s = %v without the annotation", ann, set.key, set.ips)
				}
				continue
			}
			fields := strings.Split(v, ",")
			if len(fields) != len(set.ips) {
				t.Fatalf("Parse(%q): %s = %v from %d fields", ann, set.key, set.ips, len(fields))
			}
			for i, ip := range set.ips {
				if !ip.IsGlobalUnicast() || ip.Zone() != "" || ip.Is4In6() || seen[ip] ||
					(ip.Is4() && !r.IPv4) || (ip.Is6() && !r.IPv6) {
					t.Fatalf("Parse(%q): %s = %v: %s is not a usable address", ann, set.key, set.ips, ip)
				}
				seen[ip] = true
				if want, err := netip.ParseAddr(strings.TrimSpace(fields[i])); err != nil || want != ip {
					t.Fatalf("Parse(%q): %s[%d] = %s, not the annotation's %q", ann, set.key, i, ip, fields[i])
				}
			}
		}
	})
}

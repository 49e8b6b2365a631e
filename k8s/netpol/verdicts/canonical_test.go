package verdicts

import (
	"net/netip"
	"strings"
	"testing"
)

// canonical(a, s) is a.String() == s, which it replaced without making
// the string: zones, IPv4-mapped IPv6, forms not canonical, and a zone
// longer than its stack buffer.
func TestCanonicalIsString(t *testing.T) {
	long := "fe80::1%" + strings.Repeat("z", 100)
	for _, s := range []string{
		"10.0.0.1", "010.0.0.1", "fd00::1", "FD00::1", "fd00:0::1", "fd00:0:0:0:0:0:0:1",
		"::ffff:10.0.0.1", "::FFFF:10.0.0.1", "::ffff:a00:1", "::ffff:10.0.0.1%eth0",
		"fe80::1%eth0", "fe80::1%", long, "::", "0.0.0.0", "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
		"1:0:0:1:0:0:0:1", "1::1:0:0:0:1", "2001:db8::", "::1.2.3.4",
	} {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if got, want := canonical(a, s), a.String() == s; got != want {
			t.Errorf("%q: canonical %v, String()==s %v", s, got, want)
		}
	}
}

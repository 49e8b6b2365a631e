package verdicts

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// compareKeys orders pods as their keys do: the compile's order (the
// first holder by name, the groups' numbering) must not move.
func TestCompareKeysIsKeyOrder(t *testing.T) {
	// Namespaces that are prefixes of each other, and bytes on either
	// side of '/' (0x2f): '-' (0x2d), '.' (0x2e), '0' (0x30), 'a'.
	parts := []string{"", "a", "a-", "a.", "a0", "ab", "a-b", "b", "-", "0"}
	rng := rand.New(rand.NewPCG(7, 7))
	var pods []*corev1.Pod
	for range 400 {
		ns := parts[1+rng.IntN(len(parts)-1)] + parts[rng.IntN(len(parts))]
		name := parts[1+rng.IntN(len(parts)-1)] + parts[rng.IntN(len(parts))]
		pods = append(pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	for _, a := range pods {
		for _, b := range pods {
			if got, want := compareKeys(a, b), strings.Compare(key(a), key(b)); got != want {
				t.Fatalf("compareKeys(%s, %s) = %d, want %d", key(a), key(b), got, want)
			}
		}
	}
}

// An IP the engine's index can find is one a packet's address prints as.
func TestCanonical(t *testing.T) {
	for s, want := range map[string]bool{
		"fd00::1": true, "FD00::1": false, "fd00:0::1": false, "192.0.2.1": true,
		"::ffff:192.0.2.1": true, "192.0.2.01": false, "": false, "x": false, "fe80::1%eth0": true,
	} {
		a, ok := canonical(s)
		if ok != want {
			t.Errorf("canonical(%q) = %v, want %v", s, ok, want)
		}
		if ok && a != netip.MustParseAddr(s) {
			t.Errorf("canonical(%q) = %v", s, a)
		}
	}
}

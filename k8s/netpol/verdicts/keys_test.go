package verdicts

import (
	"math/rand/v2"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// compareKeys orders pods as their keys do: the compile's order (the
// first holder by name, the groups' numbering) must not move.
func TestCompareKeysIsKeyOrder(t *testing.T) {
	// Namespaces that are prefixes of each other, and bytes on either
	// side of '/' (0x2f): '-' (0x2d), '.' (0x2e), '0' (0x30), 'a'.
	parts := []string{"", "a", "a-", "a.", "a0", "ab", "a-b", "b", "-", "0"}
	rng := rand.New(rand.NewPCG(7, 7))
	var pods []*trim.Pod
	for range 400 {
		ns := parts[1+rng.IntN(len(parts)-1)] + parts[rng.IntN(len(parts))]
		name := parts[1+rng.IntN(len(parts)-1)] + parts[rng.IntN(len(parts))]
		pods = append(pods, &trim.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	for _, a := range pods {
		for _, b := range pods {
			if got, want := compareKeys(a, b), strings.Compare(key(a), key(b)); got != want {
				t.Fatalf("compareKeys(%s, %s) = %d, want %d", key(a), key(b), got, want)
			}
		}
	}
}

package relay

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A bad entry is refused by Publish with the key and field named, and
// nothing is written; one already in the directory is left out by
// Lookup, named, and the good ones still count.
func TestDirectoryBadEntries(t *testing.T) {
	api := fake.NewClientset()
	cms := api.CoreV1().ConfigMaps("flock-system")
	good := Entry{URL: "https://[2001:db8::5]:9479", Certificate: "PEM", ServerName: "flock-relay"}
	for _, tc := range []struct {
		e    Entry
		says string
	}{
		{Entry{Certificate: "PEM", ServerName: "flock-relay"}, `key "relay-0": url is empty`},
		{Entry{URL: good.URL, ServerName: "flock-relay"}, `key "relay-0": certificate is empty`},
		{Entry{URL: good.URL, Certificate: "PEM"}, `key "relay-0": serverName is empty`},
	} {
		err := Publish(t.Context(), cms, "relay-0", tc.e)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Publish(%+v): %v, want %q", tc.e, err, tc.says)
		}
	}
	if _, err := cms.Get(t.Context(), ConfigMapName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("refused entries left a ConfigMap behind: %v", err)
	}

	if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName}, Data: map[string]string{
		"not-json": "{", "no-url": `{"certificate":"PEM","serverName":"flock-relay"}`}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Publish(t.Context(), cms, "relay-1", good); err != nil {
		t.Fatal(err)
	}
	entries, bad, err := Lookup(t.Context(), cms)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries["relay-1"] != good {
		t.Errorf("entries %v, want relay-1 alone", entries)
	}
	var msgs []string
	for _, b := range bad {
		msgs = append(msgs, b.Error())
	}
	all := strings.Join(msgs, "\n")
	if len(bad) != 2 || !strings.Contains(all, `key "not-json"`) || !strings.Contains(all, `key "no-url": url is empty`) {
		t.Errorf("bad entries %q, want not-json and no-url named", all)
	}
	// Withdrawn, the entry is gone and the others stay.
	if err := Withdraw(t.Context(), cms, "relay-1"); err != nil {
		t.Fatal(err)
	}
	if entries, _, _ := Lookup(t.Context(), cms); len(entries) != 0 {
		t.Errorf("after Withdraw: %v", entries)
	}
}

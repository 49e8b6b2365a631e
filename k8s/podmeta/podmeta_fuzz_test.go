package podmeta_test

import (
	"cmp"
	"context"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

// FuzzParseArgs checks ParseArgs against the CNI_ARGS grammar ("K=V;K=V",
// empty pairs skipped, the first '=' splits, a later key wins): it never
// returns a pair it was not given, refuses exactly the inputs with a pair
// lacking '=' or a key (naming that pair), and what it returns, written back
// as K=V;K=V, parses to the same. A valid pair k=v appended to an accepted
// string is read back as given. PodID and Standalone.Lookup take what they
// return from the args.
func FuzzParseArgs(f *testing.F) {
	f.Fuzz(func(t *testing.T, s, k, v string) {
		args, err := podmeta.ParseArgs(s)

		// The grammar, independently: the last pair of a key wins.
		want := podmeta.Args{}
		var bad string
		for _, pair := range strings.Split(s, ";") {
			if pair == "" {
				continue
			}
			i := strings.IndexByte(pair, '=')
			if i <= 0 {
				bad = pair
				break
			}
			want[pair[:i]] = pair[i+1:]
		}
		if bad != "" || err != nil {
			if err == nil {
				t.Fatalf("ParseArgs(%q) = %v, want an error for the pair %q", s, args, bad)
			}
			if bad == "" {
				t.Fatalf("ParseArgs(%q): %v; every pair is KEY=VALUE", s, err)
			}
			if args != nil {
				t.Fatalf("ParseArgs(%q) returned %v with error %v", s, args, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "CNI_ARGS") || !strings.Contains(msg, strconv.Quote(bad)) {
				t.Fatalf("ParseArgs(%q) error %q does not name CNI_ARGS and the pair %q", s, msg, bad)
			}
			return
		}
		if args == nil || !reflect.DeepEqual(args, want) {
			t.Fatalf("ParseArgs(%q) = %#v, want %#v", s, args, want)
		}
		pairs := strings.Split(s, ";")
		for key, val := range args {
			if key == "" || strings.ContainsAny(key, "=;") || strings.Contains(val, ";") {
				t.Fatalf("ParseArgs(%q) returned the pair %q=%q", s, key, val)
			}
			if !slices.Contains(pairs, key+"="+val) {
				t.Fatalf("ParseArgs(%q) returned %q=%q, which is not one of its pairs", s, key, val)
			}
		}

		// Written back, it parses to the same.
		keys := make([]string, 0, len(args))
		for key := range args {
			keys = append(keys, key)
		}
		slices.Sort(keys)
		var b strings.Builder
		for i, key := range keys {
			if i > 0 {
				b.WriteByte(';')
			}
			b.WriteString(key + "=" + args[key])
		}
		again, err := podmeta.ParseArgs(b.String())
		if err != nil || !reflect.DeepEqual(again, args) {
			t.Fatalf("ParseArgs(%q) = %v, %v; want %v (from %q)", b.String(), again, err, args, s)
		}

		// A valid pair appended wins over an earlier one of its key.
		if k != "" && !strings.ContainsAny(k, "=;") && !strings.Contains(v, ";") {
			more, err := podmeta.ParseArgs(s + ";" + k + "=" + v)
			want[k] = v
			if err != nil || !reflect.DeepEqual(more, want) {
				t.Fatalf("ParseArgs(%q) = %v, %v; want %v", s+";"+k+"="+v, more, err, want)
			}
		}

		id, err := args.PodID()
		if args[podmeta.ArgNamespace] == "" || args[podmeta.ArgName] == "" {
			if err == nil {
				t.Fatalf("PodID of %v = %v without namespace and name", args, id)
			}
			return
		}
		wantID := podmeta.ID{Namespace: args[podmeta.ArgNamespace], Name: args[podmeta.ArgName], UID: args[podmeta.ArgUID]}
		if err != nil || id != wantID {
			t.Fatalf("PodID of %v = %v, %v; want %v", args, id, err, wantID)
		}
		pod, err := podmeta.Standalone{}.Lookup(context.Background(), args)
		if err != nil || pod.ID != wantID {
			t.Fatalf("Lookup(%v) = %+v, %v", args, pod, err)
		}
		for key, val := range args {
			if got, ok := pod.Annotations[key]; ok != strings.HasPrefix(key, "flock.fritzlab.net/") || (ok && got != val) {
				t.Fatalf("Lookup(%v): annotations %v", args, pod.Annotations)
			}
		}
		if len(pod.Annotations) > len(args) {
			t.Fatalf("Lookup(%v): annotations %v it was not given", args, pod.Annotations)
		}
		if wantApp := cmp.Or(args[podmeta.ArgApp], wantID.Name); pod.App != wantApp || pod.Image != args[podmeta.ArgImage] {
			t.Fatalf("Lookup(%v): app %q image %q", args, pod.App, pod.Image)
		}
	})
}

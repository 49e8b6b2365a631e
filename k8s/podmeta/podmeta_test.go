package podmeta_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"code.fritzlab.net/fritzlab/flock/k8s/podmeta"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want podmeta.Args
	}{
		{"empty", "", podmeta.Args{}},
		{"one pair", "K8S_POD_NAME=web-0", podmeta.Args{"K8S_POD_NAME": "web-0"}},
		{
			"kubelet style",
			"IgnoreUnknown=1;K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
			podmeta.Args{"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "prod", "K8S_POD_NAME": "web-0", "K8S_POD_INFRA_CONTAINER_ID": "abc", "K8S_POD_UID": "u-1"},
		},
		{"value with =", "FLOCK_IMAGE=reg/x@sha256:ab==;A=b=c=d", podmeta.Args{"FLOCK_IMAGE": "reg/x@sha256:ab==", "A": "b=c=d"}},
		{"empty value", "K=", podmeta.Args{"K": ""}},
		{"value only =", "K==", podmeta.Args{"K": "="}},
		{"empty pairs skipped", ";;A=1;;B=2;", podmeta.Args{"A": "1", "B": "2"}},
		{"only separators", ";;;", podmeta.Args{}},
		{"later key wins", "A=1;A=2", podmeta.Args{"A": "2"}},
		{
			"annotation keys with slash and commas",
			"flock.fritzlab.net/anycast=2001:db8::1,192.0.2.1;flock.fritzlab.net/ip-algo=embed:ns/8",
			podmeta.Args{"flock.fritzlab.net/anycast": "2001:db8::1,192.0.2.1", "flock.fritzlab.net/ip-algo": "embed:ns/8"},
		},
		{"spaces kept", " A = b ", podmeta.Args{" A ": " b "}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := podmeta.ParseArgs(tc.in)
			if err != nil {
				t.Fatalf("ParseArgs(%q): %v", tc.in, err)
			}
			if got == nil {
				t.Fatalf("ParseArgs(%q) = nil map", tc.in)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseArgs(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseArgsErrors(t *testing.T) {
	tests := []struct {
		name, in, pair string
	}{
		{"no =", "K8S_POD_NAME", "K8S_POD_NAME"},
		{"no = among good pairs", "A=1;garbage;B=2", "garbage"},
		{"empty key", "=value", "=value"},
		{"bare =", "A=1;=", "="},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := podmeta.ParseArgs(tc.in)
			if err == nil {
				t.Fatalf("ParseArgs(%q) = %v, want error", tc.in, got)
			}
			if got != nil {
				t.Errorf("ParseArgs(%q) returned %v with the error", tc.in, got)
			}
			msg := err.Error()
			for _, w := range []string{"CNI_ARGS", "malformed", `"` + tc.pair + `"`} {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestPodID(t *testing.T) {
	id, err := podmeta.Args{podmeta.ArgNamespace: "prod", podmeta.ArgName: "web-0", podmeta.ArgUID: "u-1"}.PodID()
	if err != nil || id != (podmeta.ID{Namespace: "prod", Name: "web-0", UID: "u-1"}) {
		t.Errorf("PodID = %+v %v", id, err)
	}
	if id.Key() != "prod/web-0/u-1" || id.String() != "prod/web-0" {
		t.Errorf("Key %q String %q", id.Key(), id.String())
	}
	// A static pod: one incarnation whichever mirror names it.
	m1 := podmeta.ID{Namespace: "kube-system", Name: "etcd", UID: "mirror-1", StaticUID: "static"}
	m2 := podmeta.ID{Namespace: "kube-system", Name: "etcd", UID: "mirror-2", StaticUID: "static"}
	if m1.Incarnation() != "static" || m1.Key() != "kube-system/etcd/static" || !m1.Same(m2) || m1.Same(podmeta.ID{Namespace: "kube-system", Name: "etcd", UID: "mirror-1"}) {
		t.Errorf("static pod identity: %q %q %v", m1.Incarnation(), m1.Key(), m1.Same(m2))
	}
	if id.Incarnation() != "u-1" || !id.Same(id) || id.Same(podmeta.ID{Namespace: "prod", Name: "web-0", UID: "u-2"}) {
		t.Errorf("pod identity: %q", id.Incarnation())
	}
	// On disk: a record of an agent before static UIDs reads as one
	// without; one without writes as before.
	var old podmeta.ID
	if err := json.Unmarshal([]byte(`{"namespace":"prod","name":"web-0","uid":"u-1"}`), &old); err != nil || old != id {
		t.Errorf("old record: %+v %v", old, err)
	}
	if b, err := json.Marshal(id); err != nil || string(b) != `{"namespace":"prod","name":"web-0","uid":"u-1"}` {
		t.Errorf("marshal: %s %v", b, err)
	}
	if b, _ := json.Marshal(m1); !strings.Contains(string(b), `"staticUID":"static"`) {
		t.Errorf("marshal of a static pod: %s", b)
	}
	// UID is optional.
	id, err = podmeta.Args{podmeta.ArgNamespace: "prod", podmeta.ArgName: "web-0"}.PodID()
	if err != nil || id.UID != "" {
		t.Errorf("PodID without UID: %+v err %v", id, err)
	}
}

func TestStandaloneLookup(t *testing.T) {
	tests := []struct {
		name string
		args string
		want podmeta.Pod
	}{
		{
			name: "minimal: app defaults to pod name",
			args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=bare",
			want: podmeta.Pod{ID: podmeta.ID{Namespace: "default", Name: "bare"}, Annotations: map[string]string{}, App: "bare"},
		},
		{
			name: "uid, app and image",
			args: "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web-7d9f-abcde;K8S_POD_UID=1234;FLOCK_APP=web;FLOCK_IMAGE=registry.example/web:1.2",
			want: podmeta.Pod{ID: podmeta.ID{Namespace: "prod", Name: "web-7d9f-abcde", UID: "1234"}, Annotations: map[string]string{}, App: "web", Image: "registry.example/web:1.2"},
		},
		{
			name: "image with = and empty app",
			args: "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=p;FLOCK_APP=;FLOCK_IMAGE=reg/x@sha256:ab=",
			want: podmeta.Pod{ID: podmeta.ID{Namespace: "prod", Name: "p"}, Annotations: map[string]string{}, App: "p", Image: "reg/x@sha256:ab="},
		},
		{
			name: "only flock annotations are extracted",
			args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=prod;K8S_POD_NAME=p;" +
				"flock.fritzlab.net/ipv4=true;flock.fritzlab.net/anycast=2001:db8:ff::1,192.0.2.1;" +
				"flock.fritzlab.net/ipv44=typo;" +
				"example.com/ipv4=false;flock.fritzlab.net=noslash;FLOCK.FRITZLAB.NET/ipv6=false;x.flock.fritzlab.net/ipv6=false",
			want: podmeta.Pod{
				ID: podmeta.ID{Namespace: "prod", Name: "p"}, App: "p",
				Annotations: map[string]string{
					"flock.fritzlab.net/ipv4":    "true",
					"flock.fritzlab.net/anycast": "2001:db8:ff::1,192.0.2.1",
					// Unknown flock keys are passed on, so the annotation
					// parser can reject the typo.
					"flock.fritzlab.net/ipv44": "typo",
				},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args, err := podmeta.ParseArgs(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			got, err := podmeta.Standalone{}.Lookup(context.Background(), args)
			if err != nil {
				t.Fatalf("Lookup: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Lookup(%q)\n got %+v\nwant %+v", tc.args, got, tc.want)
			}
		})
	}
}

func TestStandaloneLookupMissing(t *testing.T) {
	tests := []struct {
		name, args, key string
	}{
		{"nothing", "", podmeta.ArgNamespace},
		{"no namespace", "K8S_POD_NAME=p", podmeta.ArgNamespace},
		{"empty namespace", "K8S_POD_NAMESPACE=;K8S_POD_NAME=p", podmeta.ArgNamespace},
		{"no name", "K8S_POD_NAMESPACE=prod;flock.fritzlab.net/ipv4=true", podmeta.ArgName},
		{"empty name", "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=", podmeta.ArgName},
		{"wrong case", "k8s_pod_namespace=prod;K8S_POD_NAME=p", podmeta.ArgNamespace},
	}
	var src podmeta.Source = podmeta.Standalone{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args, err := podmeta.ParseArgs(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			pod, err := src.Lookup(context.Background(), args)
			if err == nil {
				t.Fatalf("Lookup(%q) = %+v, want error", tc.args, pod)
			}
			var me *podmeta.MissingArgError
			if !errors.As(err, &me) {
				t.Fatalf("error %v (%T) is not a *MissingArgError", err, err)
			}
			if me.Key != tc.key {
				t.Errorf("MissingArgError.Key = %q, want %q", me.Key, tc.key)
			}
			if !strings.Contains(err.Error(), tc.key) {
				t.Errorf("error %q does not name %s", err, tc.key)
			}
			if !reflect.DeepEqual(pod, podmeta.Pod{}) {
				t.Errorf("Lookup returned %+v with the error", pod)
			}
		})
	}
}

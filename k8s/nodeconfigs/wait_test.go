package nodeconfigs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
)

var (
	forbidden = apierrors.NewForbidden(GVR.GroupResource(), "vm",
		errors.New(`User "system:serviceaccount:flock-system:flock" cannot get resource "nodeconfigs" in API group "flock.fritzlab.net" at the cluster scope`))
	// What client-go makes of the API server's "404 page not found" (no
	// such resource: the CRD is not installed).
	noCRD        = apierrors.NewGenericServerResponse(404, "GET", GVR.GroupResource(), "vm", "404 page not found", 0, true)
	noObject     = apierrors.NewNotFound(GVR.GroupResource(), "vm")
	unauthorized = apierrors.NewUnauthorized("Unauthorized")
	refused      = &url.Error{Op: "Get", URL: "https://10.96.0.1:443/apis/flock.fritzlab.net/v1alpha1/nodeconfigs/vm",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	noMatch = &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: GVR.Group, Kind: "NodeConfig"}, SearchedVersions: []string{"v1alpha1"}}
)

// Explain tells what keeps a NodeConfig from being read, and what to do;
// a NodeConfig that does not exist (yet) is no error.
func TestExplain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		cause string // "" = nil
		want  []string
	}{
		{"the object does not exist", noObject, "", nil},
		{"RBAC", forbidden, CauseForbidden, []string{"forbidden by RBAC", `cannot get resource "nodeconfigs"`, "deploy/rbac.yaml"}},
		{"no CRD, or not this version", noCRD, CauseNoCRD, []string{"serves no nodeconfigs.flock.fritzlab.net/v1alpha1", "does not serve the version this agent reads, v1alpha1", "the server could not find the requested resource", "kubectl apply -k deploy/", "spec.versions"}},
		{"no kind", noMatch, CauseNoCRD, []string{"the NodeConfig CRD is not installed", "no matches for kind"}},
		{"credentials", unauthorized, CauseUnauthorized, []string{"unauthorized", "credentials"}},
		{"connection refused", refused, CauseUnreachable, []string{"the API server cannot be reached", "connection refused"}},
		{"try timed out", fmt.Errorf("get: %w", context.DeadlineExceeded), CauseUnreachable, []string{"cannot be reached", "deadline exceeded"}},
		{"server error", apierrors.NewInternalError(errors.New("etcd down")), CauseAPI, []string{"the API server answered", "etcd down"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Explain(tc.err)
			if tc.cause == "" {
				if got != nil {
					t.Fatalf("Explain = %v, want nil", got)
				}
				return
			}
			var ae *APIError
			if !errors.As(got, &ae) || ae.Cause != tc.cause || !errors.Is(got, tc.err) {
				t.Fatalf("Explain = %#v, want cause %s wrapping %v", got, tc.cause, tc.err)
			}
			for _, w := range tc.want {
				if !strings.Contains(got.Error(), w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
			if Explain(got) != got {
				t.Error("Explain of an explained error explains it again")
			}
		})
	}
}

// Wait reports every read that failed, as it happens, and goes on
// waiting: RBAC denied at first, fixed, the NodeConfig then created.
func TestWaitReportsErrors(t *testing.T) {
	dyn := fakeClient()
	reads := 0
	dyn.PrependReactor("get", GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
		reads++
		switch reads {
		case 1, 2:
			return true, nil, forbidden
		case 3:
			return true, nil, noCRD
		case 4:
			return true, nil, noObject
		case 5:
			if err := dyn.Tracker().Add(nodeConfig("vm", 4, 65004)); err != nil {
				return true, nil, err
			}
		}
		return false, nil, nil
	})
	var got []string
	spec, gen, err := New(kubeclient.NewFactory(), dyn, "vm").Wait(context.Background(), WaitOptions{
		Timeout: time.Minute, Poll: time.Millisecond,
		Progress: func(err error) {
			var ae *APIError
			switch {
			case err == nil:
				got = append(got, "missing")
			case errors.As(err, &ae):
				got = append(got, ae.Cause)
			default:
				got = append(got, "unexplained "+err.Error())
			}
		},
	})
	if err != nil || spec.ASN != 65004 || gen != 4 {
		t.Fatalf("Wait = %+v %d %v", spec, gen, err)
	}
	if want := "Forbidden,Forbidden,NoCRD,missing"; strings.Join(got, ",") != want {
		t.Errorf("progress %v, want %s", got, want)
	}
}

// At the deadline the error says what kept the NodeConfig from being
// read; a NodeConfig that never came keeps its message.
func TestWaitTimesOut(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{forbidden, `NodeConfig "vm" (waited 10ms): forbidden by RBAC: nodeconfigs.flock.fritzlab.net "vm" is forbidden`},
		{unauthorized, `NodeConfig "vm" (waited 10ms): unauthorized: Unauthorized; the API server does not accept`},
		{noObject, `NodeConfig "vm" does not exist (waited 10ms): create one for this node (see deploy/examples/nodeconfig.yaml)`},
	} {
		dyn := fakeClient()
		dyn.PrependReactor("get", GVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
		_, _, err := New(kubeclient.NewFactory(), dyn, "vm").Wait(context.Background(), WaitOptions{Timeout: 10 * time.Millisecond, Poll: time.Millisecond})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Wait: %v, want %q", err, tc.want)
		}
		if tc.err != noObject && !errors.Is(err, tc.err) {
			t.Errorf("Wait: %v does not wrap %v", err, tc.err)
		}
	}
	// ctx ends the wait.
	dyn := fakeClient()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := New(kubeclient.NewFactory(), dyn, "vm").Wait(ctx, WaitOptions{Timeout: time.Hour, Poll: time.Millisecond}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with ctx ending: %v", err)
	}
}

// A spec that does not convert names each field by its path.
func TestSpecOfNamesFields(t *testing.T) {
	u := nodeConfig("vm", 1, 65001)
	spec := u.Object["spec"].(map[string]any)
	spec["pools"] = []any{map[string]any{"cidr": "fd00::/64"}, map[string]any{"cidr": int64(10)}}
	spec["bgp"] = map[string]any{"peers": []any{
		map[string]any{"address": "fd00::2", "asn": int64(65002)},
		map[string]any{"address": "fd00::3", "asn": int64(65003), "timers": map[string]any{"holdTime": "ninety"}},
		map[string]any{"address": "fd00::4", "asn": "65004", "ttlSecurityMin": int64(300), "bogus": true},
	}}
	_, err := SpecOf(u)
	want := `nodeconfig vm: spec.bgp.peers[1].timers.holdTime: cannot unmarshal string "ninety" into an integer; ` +
		`spec.bgp.peers[2].asn: cannot unmarshal string "65004" into an integer; ` +
		`spec.bgp.peers[2].ttlSecurityMin: cannot unmarshal number 300 into an integer of 0..255; ` +
		`spec.pools[1].cidr: cannot unmarshal number 10 into a string`
	if err == nil || err.Error() != want {
		t.Errorf("SpecOf:\n got %v\nwant %s", err, want)
	}
	if _, err := SpecOf(nodeConfig("vm", 1, 65001)); err != nil {
		t.Errorf("SpecOf of a good spec: %v", err)
	}
}

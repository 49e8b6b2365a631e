package lbcontroller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"code.fritzlab.net/fritzlab/flock/k8s/claims"
	"code.fritzlab.net/fritzlab/flock/k8s/loadbalancers"
)

var (
	servicesGVR = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	eventsGVR   = schema.GroupVersionResource{Version: "v1", Resource: "events"}
)

// apiStatus writes status.loadBalancer.ingress through the status
// subresource: a merge patch carrying the Service's UID, so a Service
// re-created under the name is never given its predecessor's address.
type apiStatus struct{ dyn dynamic.Interface }

func (s apiStatus) SetIngress(ctx context.Context, r loadbalancers.ServiceRef, ips []netip.Addr) error {
	ingress := make([]map[string]string, 0, len(ips))
	for _, ip := range ips {
		ingress = append(ingress, map[string]string{"ip": ip.String(), "ipMode": string(corev1.LoadBalancerIPModeVIP)})
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": r.UID},
		"status":   map[string]any{"loadBalancer": map[string]any{"ingress": ingress}},
	})
	if err != nil {
		return err
	}
	_, err = s.dyn.Resource(servicesGVR).Namespace(r.Namespace).Patch(ctx, r.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("Service %s: status.loadBalancer.ingress: %w", r, err)
	}
	return nil
}

// apiEvents records Events on Services, each (Service, reason, message)
// at most once per repeatEvery: the assigner re-decides every pass and
// must not flood the namespace with the same Warning.
type apiEvents struct {
	dyn  dynamic.Interface
	node string
	log  func(msg string, args ...any)

	mu   sync.Mutex
	last map[string]time.Time
}

const repeatEvery = 10 * time.Minute

func (e *apiEvents) Event(r loadbalancers.ServiceRef, warning bool, reason, msg string) {
	key := r.String() + "\x00" + r.UID + "\x00" + reason + "\x00" + msg
	now := time.Now()
	e.mu.Lock()
	if e.last == nil {
		e.last = map[string]time.Time{}
	}
	if t, ok := e.last[key]; ok && now.Sub(t) < repeatEvery {
		e.mu.Unlock()
		return
	}
	e.last[key] = now
	for k, t := range e.last {
		if now.Sub(t) >= repeatEvery {
			delete(e.last, k)
		}
	}
	e.mu.Unlock()
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	ts := metav1.NewTime(now)
	ev := &corev1.Event{
		TypeMeta:       metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", r.Name, now.UnixNano()), Namespace: r.Namespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: r.Namespace, Name: r.Name, UID: types.UID(r.UID)},
		Reason:         reason, Message: msg, Type: typ,
		Source:         corev1.EventSource{Component: "flock-loadbalancers", Host: e.node},
		FirstTimestamp: ts, LastTimestamp: ts, Count: 1,
		ReportingController: "flock.fritzlab.net/loadbalancers", ReportingInstance: e.node,
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ev)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.dyn.Resource(eventsGVR).Namespace(r.Namespace).Create(ctx, &unstructured.Unstructured{Object: raw}, metav1.CreateOptions{}); err != nil && e.log != nil {
		e.log("no Event on the Service", "service", r.String(), "reason", reason, "err", err)
	}
}

// apiClaims are the cluster-wide claims as the assigner sees them.
type apiClaims struct{ c *claims.Claims }

func (l apiClaims) Claim(ctx context.Context, ip netip.Addr, pool string, svc loadbalancers.ServiceRef, sharingKey string) error {
	err := l.c.ClaimSharedService(ctx, ip, pool, sharingKey, claims.ServiceRef(svc))
	var held *claims.ClaimedError
	if errors.As(err, &held) {
		he := &loadbalancers.HeldError{IP: ip, Holder: holder(held.Holder)}
		for _, h := range held.Holder.Holders() {
			he.Services = append(he.Services, loadbalancers.ServiceRef(h))
		}
		return he
	}
	return err
}

func (l apiClaims) Release(ctx context.Context, ip netip.Addr, svc loadbalancers.ServiceRef) error {
	return l.c.ReleaseService(ctx, ip, claims.ServiceRef(svc))
}

func (l apiClaims) Services() map[netip.Addr][]loadbalancers.ServiceRef {
	out := map[netip.Addr][]loadbalancers.ServiceRef{}
	for _, cl := range l.c.ServiceClaims() {
		for _, h := range cl.Holders() {
			out[cl.IP] = append(out[cl.IP], loadbalancers.ServiceRef(h))
		}
	}
	return out
}

func (l apiClaims) Others() map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, cl := range l.c.PodClaims() {
		out[cl.IP] = holder(cl)
	}
	return out
}

// holder names a claim's holder for an Event: the pod, or the Services
// (every sharer of a shared address, and their key).
func holder(cl claims.Claim) string {
	if hs := cl.Holders(); len(hs) > 0 {
		names := make([]string, len(hs))
		for i, h := range hs {
			names[i] = h.String()
		}
		s := "Service " + strings.Join(names, ", ")
		if len(hs) > 1 {
			s = "Services " + strings.Join(names, ", ")
		}
		if cl.SharingKey != "" {
			s += fmt.Sprintf(" (sharing key %q)", cl.SharingKey)
		}
		return s
	}
	if cl.Service != nil {
		return "Service " + cl.Service.String()
	}
	return "pod " + cl.Pod.String()
}

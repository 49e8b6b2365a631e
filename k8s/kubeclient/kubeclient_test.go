package kubeclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// apiServer answers as the API server would, in JSON, and records the
// requests.
type apiServer struct {
	mu   sync.Mutex
	reqs []string
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.reqs = append(a.reqs, r.URL.RequestURI())
	a.mu.Unlock()
	if !strings.HasPrefix(r.Header.Get("Accept"), "application/vnd.kubernetes.protobuf") || r.UserAgent() != "flock-test" {
		http.Error(w, "accept "+r.Header.Get("Accept")+", agent "+r.UserAgent(), http.StatusBadRequest)
		return
	}
	pod := corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", ResourceVersion: "7"}}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	switch {
	case r.URL.Path == "/api/v1/namespaces/shop/pods/web":
		_ = enc.Encode(pod)
	case r.URL.Path == "/api/v1/pods" && r.URL.Query().Get("watch") == "true":
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			// WatchList: the first list streamed as events, its end
			// marked by a bookmark.
			_ = enc.Encode(metav1.WatchEvent{Type: "ADDED", Object: runtime.RawExtension{Object: &pod}})
			end := corev1.Pod{TypeMeta: pod.TypeMeta, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "7",
				Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
			_ = enc.Encode(metav1.WatchEvent{Type: "BOOKMARK", Object: runtime.RawExtension{Object: &end}})
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done() // nothing changes
	case r.URL.Path == "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-abc":
		_ = enc.Encode(discoveryv1.EndpointSlice{TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{Name: "web-abc", Namespace: "shop"}, AddressType: discoveryv1.AddressTypeIPv6})
	case r.URL.Path == "/api/v1/namespaces/shop/services/web":
		_ = enc.Encode(corev1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}})
	case r.URL.Path == "/api/v1/pods":
		_ = enc.Encode(corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}, ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: []corev1.Pod{pod}})
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = enc.Encode(metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure,
			Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: "not found"})
	}
}

func (a *apiServer) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.reqs...)
}

func TestClient(t *testing.T) {
	api := &apiServer{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	c, err := New(&rest.Config{Host: srv.URL, UserAgent: "flock-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	p, err := c.Pods("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil || p.Name != "web" || p.ResourceVersion != "7" {
		t.Fatalf("get: %+v, %v", p, err)
	}
	if _, err := c.Nodes().Get(ctx, "gone", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("missing node: want NotFound, got %v", err)
	}
	if s, err := c.Services("shop").Get(ctx, "web", metav1.GetOptions{}); err != nil || s.Name != "web" {
		t.Errorf("service: %+v, %v", s, err)
	}
	d, err := NewDiscovery(&rest.Config{Host: srv.URL, UserAgent: "flock-test"})
	if err != nil {
		t.Fatal(err)
	}
	if es, err := d.EndpointSlices("shop").Get(ctx, "web-abc", metav1.GetOptions{}); err != nil || es.Name != "web-abc" || es.AddressType != discoveryv1.AddressTypeIPv6 {
		t.Errorf("endpointslice from /apis/discovery.k8s.io/v1: %+v, %v", es, err)
	}

	inf := NewInformer(c.Pods(""), &corev1.Pod{}, func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=vm" })
	ictx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { inf.RunWithContext(ictx); close(done) }()
	defer func() { cancel(); <-done }()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	if objs, _ := inf.GetIndexer().ByIndex(cache.NamespaceIndex, "shop"); len(objs) != 1 {
		t.Errorf("cache by namespace: %v", objs)
	}
	// The first list streamed through the watch (WatchList, the default
	// since Kubernetes 1.35), or a list and a watch: with the selector.
	var list, watch, watchList bool
	for _, r := range api.requests() {
		if strings.HasPrefix(r, "/api/v1/pods?") && strings.Contains(r, "fieldSelector=spec.nodeName%3Dvm") {
			list = list || !strings.Contains(r, "watch=true")
			watch = watch || strings.Contains(r, "watch=true")
			watchList = watchList || strings.Contains(r, "sendInitialEvents=true")
		}
	}
	if !watchList && (!list || !watch) {
		t.Errorf("want a watch-list, or a list and a watch, with the field selector, got %q", api.requests())
	}
}

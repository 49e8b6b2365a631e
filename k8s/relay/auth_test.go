package relay

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// The relay's authorizer, as cmd/flock-relay builds it from a config
// that sets no QPS, lets 25 nodes in (25 tokens, as after the other relay
// went away) against an API server that answers at once without waiting
// on client-go's default 5 requests a second (two SubjectAccessReviews a
// node: 2.5 nodes a second). A node's watch gets no headers, and its
// informer no events, until its review is done.
func TestReviewsOfManyNodesAreNotThrottled(t *testing.T) {
	api := fakeReviewer()
	defer api.Close()
	auth := relayAuthorizer(t, api.URL)
	const nodes = 25
	start := time.Now()
	var wg sync.WaitGroup
	took := make([]time.Duration, nodes)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := auth.Authorize(t.Context(), fmt.Sprintf("token-of-node-%d", i)); err != nil {
				t.Errorf("node %d: %v", i, err)
			}
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	slowest := time.Duration(0)
	for _, d := range took {
		slowest = max(slowest, d)
	}
	t.Logf("%d nodes authorized; the last after %s (API server answers in microseconds)", nodes, slowest.Round(100*time.Millisecond))
	if slowest > 2*time.Second {
		t.Fatalf("the last of %d nodes waited %s for its review: the relay's review client is throttled at 5 QPS (2 SARs a node), so a failover of N nodes stalls them for about 2N/5 seconds", nodes, slowest.Round(100*time.Millisecond))
	}
}

// Anyone who reaches the relay's port can send bearer tokens that are no
// good; a node's review does not queue behind their TokenReviews.
func TestGarbageTokensDoNotStallANode(t *testing.T) {
	api := fakeReviewer()
	defer api.Close()
	auth := relayAuthorizer(t, api.URL)
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = auth.Authorize(t.Context(), fmt.Sprintf("garbage-%d", i))
		}()
	}
	time.Sleep(50 * time.Millisecond) // the garbage is queued first
	start := time.Now()
	if err := auth.Authorize(t.Context(), "token-of-a-node"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	wg.Wait()
	t.Logf("a node's review behind 60 unauthenticated requests took %s", took.Round(100*time.Millisecond))
	if took > 2*time.Second {
		t.Fatalf("a node's review waited %s behind 60 requests with bad tokens (unauthenticated): they share the 5 QPS review client", took.Round(100*time.Millisecond))
	}
}

// fakeReviewer answers TokenReviews (tokens starting "garbage" are not
// valid) and SubjectAccessReviews (allowed) at once.
func fakeReviewer() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.Contains(r.URL.Path, "tokenreviews") && bytes.Contains(body, []byte("garbage")):
			fmt.Fprint(w, `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","status":{"authenticated":false,"error":"invalid bearer token"}}`)
		case strings.Contains(r.URL.Path, "tokenreviews"):
			fmt.Fprint(w, `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","status":{"authenticated":true,"audiences":["flock-relay"],"user":{"username":"system:serviceaccount:flock-system:flock"}}}`)
		case strings.Contains(r.URL.Path, "subjectaccessreviews"):
			fmt.Fprint(w, `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","status":{"allowed":true}}`)
		default:
			http.NotFound(w, r)
		}
	}))
}

// relayAuthorizer is the authorizer cmd/flock-relay builds (its config
// sets no QPS: client-go's default), against host.
func relayAuthorizer(t *testing.T, host string) *ReviewAuthorizer {
	pc := &rest.Config{Host: host}
	pc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	pc.ContentType = "application/vnd.kubernetes.protobuf"
	a, err := NewReviewAuthorizer(pc)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

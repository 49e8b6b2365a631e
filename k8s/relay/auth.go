package relay

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// reviewTimeout bounds each review request: a node not let in by then is
// answered 503 and tries the next relay, or the API server.
const reviewTimeout = 10 * time.Second

// NewReviewAuthorizer asks the API server of cfg, without client-go's
// client-side rate limit (5 requests a second unless cfg sets one):
// every node's watch waits for its review, so a relay taking over the
// other's nodes let them in at 2.5 a second (a TokenReview and two
// SubjectAccessReviews each), and tokens that are no good, which anyone
// who reaches the relay can send, queued ahead of them. The API server's
// priority and fairness limits the reviews instead.
func NewReviewAuthorizer(cfg *rest.Config) (*ReviewAuthorizer, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst, c.RateLimiter = -1, 0, nil
	if c.Timeout == 0 || c.Timeout > reviewTimeout {
		c.Timeout = reviewTimeout
	}
	authn, err := authnclient.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("relay: token review client: %w", err)
	}
	authz, err := authzclient.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("relay: access review client: %w", err)
	}
	return &ReviewAuthorizer{Tokens: authn.TokenReviews(), Access: authz.SubjectAccessReviews()}, nil
}

// ReviewAuthorizer asks the API server: the token must be valid for
// Audience (TokenReview), and its user allowed to list and watch pods in
// every namespace (SubjectAccessReview), as it would be to read them from
// the API server. Answers are kept a while, keyed by the token's hash.
type ReviewAuthorizer struct {
	Tokens authnclient.TokenReviewInterface
	Access authzclient.SubjectAccessReviewInterface
	// Allowed and Denied are how long answers are kept (default 1m and
	// 10s): a revoked token or role stops working within Allowed.
	Allowed, Denied time.Duration

	mu    sync.Mutex
	known map[[32]byte]answer
}

type answer struct {
	err     error
	expires time.Time
}

// Authorize implements Authorizer.
func (a *ReviewAuthorizer) Authorize(ctx context.Context, token string) error {
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	a.mu.Lock()
	if ans, ok := a.known[key]; ok && now.Before(ans.expires) {
		a.mu.Unlock()
		return ans.err
	}
	a.mu.Unlock()
	err := a.review(ctx, token)
	if err != nil && !isAnswer(err) {
		return err // not an answer: asked again next time
	}
	keep := a.Allowed
	if keep <= 0 {
		keep = time.Minute
	}
	if err != nil {
		if keep = a.Denied; keep <= 0 {
			keep = 10 * time.Second
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.known == nil {
		a.known = map[[32]byte]answer{}
	}
	for k, ans := range a.known { // the expired go; few tokens are live
		if now.After(ans.expires) {
			delete(a.known, k)
		}
	}
	a.known[key] = answer{err: err, expires: now.Add(keep)}
	return err
}

func isAnswer(err error) bool {
	return err != nil && (errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden))
}

func (a *ReviewAuthorizer) review(ctx context.Context, token string) error {
	tr, err := a.Tokens.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("relay: token review: %w", err)
	}
	if !tr.Status.Authenticated {
		return fmt.Errorf("%w: token not valid for audience %q: %s", ErrUnauthorized, Audience, tr.Status.Error)
	}
	// An authenticator that ignores audiences answers without them.
	if !slices.Contains(tr.Status.Audiences, Audience) {
		return fmt.Errorf("%w: the API server did not say the token is for audience %q (it said %q)", ErrUnauthorized, Audience, tr.Status.Audiences)
	}
	u := tr.Status.User
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	for _, verb := range []string{"list", "watch"} {
		sar, err := a.Access.Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: verb, Resource: "pods", Version: "v1"},
		}}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("relay: access review: %w", err)
		}
		if !sar.Status.Allowed {
			return fmt.Errorf("%w: %s may not %s pods in every namespace", ErrForbidden, u.Username, verb)
		}
	}
	return nil
}

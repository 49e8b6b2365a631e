// Package kubeclient is the agent's client of the core/v1 API, and builds
// the informers of flock's packages. client-go's typed clientset and its
// informer factories would link (and register at start) every API group;
// the agent reads a handful of core/v1 resources.
package kubeclient

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Client reads core/v1 resources.
type Client struct {
	rest   rest.Interface
	params runtime.ParameterCodec
}

// New builds a client from cfg (its QPS, Burst and UserAgent apply), as
// client-go's typed core/v1 client configures itself.
func New(cfg *rest.Config) (*Client, error) {
	return newClient(cfg, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme)
}

// Discovery reads discovery.k8s.io/v1 (EndpointSlices).
type Discovery struct{ c *Client }

// NewDiscovery builds a discovery.k8s.io/v1 client from cfg.
func NewDiscovery(cfg *rest.Config) (*Discovery, error) {
	c, err := newClient(cfg, "/apis", discoveryv1.SchemeGroupVersion, discoveryv1.AddToScheme)
	return &Discovery{c: c}, err
}

// EndpointSlices of namespace ("": all namespaces, to list and watch).
func (d *Discovery) EndpointSlices(namespace string) *Resource[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList] {
	return &Resource[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList]{c: d.c, resource: "endpointslices", namespace: namespace,
		newObj:  func() *discoveryv1.EndpointSlice { return &discoveryv1.EndpointSlice{} },
		newList: func() *discoveryv1.EndpointSliceList { return &discoveryv1.EndpointSliceList{} }}
}

func newClient(cfg *rest.Config, apiPath string, gv schema.GroupVersion, add func(*runtime.Scheme) error) (*Client, error) {
	scheme := runtime.NewScheme()
	if err := add(scheme); err != nil {
		return nil, fmt.Errorf("%s scheme: %w", gv, err)
	}
	// ListOptions, GetOptions and Status for the parameter codec and errors.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	c := rest.CopyConfig(cfg)
	c.APIPath = apiPath
	c.GroupVersion = &gv
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("%s client: %w", gv, err)
	}
	return &Client{rest: rc, params: runtime.NewParameterCodec(scheme)}, nil
}

// Services of namespace ("": all namespaces, to list and watch).
func (c *Client) Services(namespace string) *Resource[*corev1.Service, *corev1.ServiceList] {
	return &Resource[*corev1.Service, *corev1.ServiceList]{c: c, resource: "services", namespace: namespace,
		newObj: func() *corev1.Service { return &corev1.Service{} }, newList: func() *corev1.ServiceList { return &corev1.ServiceList{} }}
}

// Pods of namespace ("": all namespaces, to list and watch).
func (c *Client) Pods(namespace string) *Resource[*corev1.Pod, *corev1.PodList] {
	return &Resource[*corev1.Pod, *corev1.PodList]{c: c, resource: "pods", namespace: namespace,
		newObj: func() *corev1.Pod { return &corev1.Pod{} }, newList: func() *corev1.PodList { return &corev1.PodList{} }}
}

// Secrets of namespace.
func (c *Client) Secrets(namespace string) *Resource[*corev1.Secret, *corev1.SecretList] {
	return &Resource[*corev1.Secret, *corev1.SecretList]{c: c, resource: "secrets", namespace: namespace,
		newObj: func() *corev1.Secret { return &corev1.Secret{} }, newList: func() *corev1.SecretList { return &corev1.SecretList{} }}
}

// Namespaces (cluster scoped).
func (c *Client) Namespaces() *Resource[*corev1.Namespace, *corev1.NamespaceList] {
	return &Resource[*corev1.Namespace, *corev1.NamespaceList]{c: c, resource: "namespaces",
		newObj: func() *corev1.Namespace { return &corev1.Namespace{} }, newList: func() *corev1.NamespaceList { return &corev1.NamespaceList{} }}
}

// Nodes (cluster scoped).
func (c *Client) Nodes() *Resource[*corev1.Node, *corev1.NodeList] {
	return &Resource[*corev1.Node, *corev1.NodeList]{c: c, resource: "nodes",
		newObj: func() *corev1.Node { return &corev1.Node{} }, newList: func() *corev1.NodeList { return &corev1.NodeList{} }}
}

// Resource is one resource of one namespace (or cluster scoped, or all
// namespaces); T is its object type, L its list type. Its methods have the
// signatures of client-go's typed clients, so an interface a consumer
// declares is met by both (and by client-go's fakes in tests).
type Resource[T, L runtime.Object] struct {
	c                   *Client
	resource, namespace string
	newObj              func() T
	newList             func() L
}

// request is a GET on the resource, preferring protobuf as client-go does
// for core types.
func (r *Resource[T, L]) request() *rest.Request {
	return r.c.rest.Get().UseProtobufAsDefault().NamespaceIfScoped(r.namespace, r.namespace != "").Resource(r.resource)
}

// Get one object by name.
func (r *Resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	obj := r.newObj()
	err := r.request().Name(name).VersionedParams(&opts, r.c.params).Do(ctx).Into(obj)
	return obj, err
}

// List the objects.
func (r *Resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	list := r.newList()
	err := r.request().VersionedParams(&opts, r.c.params).Timeout(timeout(opts)).Do(ctx).Into(list)
	return list, err
}

// Watch the objects.
func (r *Resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request().VersionedParams(&opts, r.c.params).Timeout(timeout(opts)).Watch(ctx)
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

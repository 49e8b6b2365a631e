package services

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"code.fritzlab.net/fritzlab/flock/k8s/delivery"
)

// The selectors of the informers: kube-proxy's own (cmd/kube-proxy/app/
// server.go). It never sees a Service of another proxy or a headless one,
// nor an EndpointSlice labelled headless, and delivery decides as
// kube-proxy does (Skipped, Decide), so none of them can put an address
// out; the API server leaves them out of the lists and watches. Not
// kube-proxy's, and not used: a label selector on slices of another
// proxy's Services (kube-proxy lists those slices; a slice keeps the
// label for a while after its Service lost it).
var (
	serviceLabels = labels.NewSelector().Add(notLabelled(delivery.LabelServiceProxyName)).String()
	serviceFields = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
	sliceLabels   = labels.NewSelector().Add(notLabelled(delivery.LabelHeadless)).String()
)

func notLabelled(key string) labels.Requirement {
	r, err := labels.NewRequirement(key, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant key
	}
	return *r
}

// trimService keeps of a Service what ForService and the controller read
// (the cache holds every Service of the cluster): namespace, name, uid,
// the service-proxy-name label; type, clusterIP, externalIPs,
// loadBalancerClass, externalTrafficPolicy, publishNotReadyAddresses,
// ipFamilies, each port's name, number and protocol; each LoadBalancer ingress
// IP and its ipMode. TestTrimKeepsWhatIsRead fails when a field read
// later is dropped.
func trimService(obj any) (any, error) {
	s, ok := obj.(*corev1.Service)
	if !ok {
		return obj, nil
	}
	out := &corev1.Service{
		ObjectMeta: trimMeta(s.ObjectMeta, delivery.LabelServiceProxyName),
		Spec: corev1.ServiceSpec{
			Type:                     s.Spec.Type,
			ClusterIP:                s.Spec.ClusterIP,
			ExternalIPs:              s.Spec.ExternalIPs,
			LoadBalancerClass:        s.Spec.LoadBalancerClass,
			ExternalTrafficPolicy:    s.Spec.ExternalTrafficPolicy,
			PublishNotReadyAddresses: s.Spec.PublishNotReadyAddresses,
			IPFamilies:               s.Spec.IPFamilies,
		},
	}
	if len(s.Spec.Ports) > 0 {
		out.Spec.Ports = make([]corev1.ServicePort, len(s.Spec.Ports))
		for i, p := range s.Spec.Ports {
			out.Spec.Ports[i] = corev1.ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol}
		}
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IP != "" { // a hostname is another implementation's
			out.Status.LoadBalancer.Ingress = append(out.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: in.IP, IPMode: in.IPMode})
		}
	}
	return out, nil
}

// trimSlice keeps of an EndpointSlice what delivery.Decide and the
// controller's index read: namespace, name, the service-name, managed-by
// and headless labels; addressType; each port's name, number and
// protocol; each endpoint's first address (kube-proxy uses no other),
// conditions and nodeName. Dropped: targetRef, hostname, zone, hints,
// the other addresses.
func trimSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := &discoveryv1.EndpointSlice{
		ObjectMeta:  trimMeta(s.ObjectMeta, discoveryv1.LabelServiceName, discoveryv1.LabelManagedBy, delivery.LabelHeadless),
		AddressType: s.AddressType,
	}
	if len(s.Ports) > 0 {
		out.Ports = make([]discoveryv1.EndpointPort, len(s.Ports))
		for i, p := range s.Ports {
			out.Ports[i] = discoveryv1.EndpointPort{Name: p.Name, Port: p.Port, Protocol: p.Protocol}
		}
	}
	if len(s.Endpoints) > 0 {
		out.Endpoints = make([]discoveryv1.Endpoint, len(s.Endpoints))
		for i, e := range s.Endpoints {
			t := discoveryv1.Endpoint{Conditions: e.Conditions, NodeName: e.NodeName}
			if len(e.Addresses) > 0 {
				t.Addresses = []string{e.Addresses[0]}
			}
			out.Endpoints[i] = t
		}
	}
	return out, nil
}

// trimMeta keeps the identity (and the resourceVersion, for whoever
// debugs the cache) and the labels named.
func trimMeta(m metav1.ObjectMeta, keep ...string) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
	for _, k := range keep {
		if v, ok := m.Labels[k]; ok {
			if out.Labels == nil {
				out.Labels = map[string]string{}
			}
			out.Labels[k] = v
		}
	}
	return out
}

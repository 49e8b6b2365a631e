package main

import (
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	flockv1 "code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
	"code.fritzlab.net/fritzlab/flock/k8s/claims"
)

// The objects carry what real ones do (labels, owner references, a
// container with ports, environment and probes, kubelet's status), since
// their size is what every watcher pays for.

const (
	appPort           = 8080
	appPortName       = "http"
	flockAnycastKey   = "flock.fritzlab.net/anycast"
	flockAddressesKey = "flock.fritzlab.net/addresses"
	lbClass           = "flock.fritzlab.net/bgp"
)

var created = metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))

func namespaceObj(i int) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i), Labels: map[string]string{
		"kubernetes.io/metadata.name": nsName(i),
		"team":                        fmt.Sprintf("team-%d", i%50),
		"env":                         []string{"prod", "staging", "dev"}[i%3],
	}}}
}

func serviceAccountObj(i int) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: nsName(i)}}
}

// nodeObj is model node i as kubelet would register it; status through
// nodeStatus.
func nodeObj(i int) *corev1.Node {
	name := nodeName(i)
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/hostname":           name,
		"kubernetes.io/os":                 "linux",
		"kubernetes.io/arch":               "amd64",
		"beta.kubernetes.io/os":            "linux",
		"beta.kubernetes.io/arch":          "amd64",
		"topology.kubernetes.io/zone":      fmt.Sprintf("zone-%d", i%3),
		"topology.kubernetes.io/region":    "region-1",
		"node.kubernetes.io/instance-type": "m-8x32",
		"example.com/rack":                 fmt.Sprintf("rack-%03d", i/48),
	}}, Spec: corev1.NodeSpec{}}
}

func nodeStatus(n *corev1.Node, i int) {
	now := metav1.Now()
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	n.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{"cpu": q("8"), "memory": q("32Gi"), "pods": q("110"), "ephemeral-storage": q("100Gi")},
		Allocatable: corev1.ResourceList{"cpu": q("7800m"), "memory": q("31Gi"), "pods": q("110"), "ephemeral-storage": q("95Gi")},
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available", LastHeartbeatTime: now, LastTransitionTime: created},
			{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure", LastHeartbeatTime: now, LastTransitionTime: created},
			{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available", LastHeartbeatTime: now, LastTransitionTime: created},
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: created},
		},
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP(i).String()}, {Type: corev1.NodeHostName, Address: nodeName(i)}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		NodeInfo: corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032x", fnvHash(nodeName(i))), SystemUUID: fmt.Sprintf("%08x-0000-0000-0000-000000000000", i),
			BootID: fmt.Sprintf("%08x-boot", i), KernelVersion: "6.1.0-27-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)",
			ContainerRuntimeVersion: "containerd://2.4.2", KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"},
	}
	for j := range nodeImages {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{
			Names:     []string{fmt.Sprintf("registry.example.com/team-%d/app-%d@sha256:%064x", j, j, j), fmt.Sprintf("registry.example.com/team-%d/app-%d:v1.%d", j, j, j)},
			SizeBytes: int64(20_000_000 + j*1_000_000)})
	}
}

func labelsOf(w workload) map[string]string {
	return map[string]string{
		"app":                          w.name(),
		"app.kubernetes.io/name":       w.name(),
		"app.kubernetes.io/part-of":    fmt.Sprintf("system-%d", w.index/30),
		"app.kubernetes.io/managed-by": "helm",
		"tier":                         []string{"frontend", "backend", "data"}[w.index%3],
		"pod-template-hash":            w.hash(),
	}
}

// podObj is pod-network pod k (of workload w) as its ReplicaSet creates
// it, already bound to its node; podStatus is what kubelet then reports.
func podObj(w workload, k int) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: w.podName(k), Namespace: w.namespace(), Labels: labelsOf(w),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: w.name() + "-" + w.hash(),
			UID: "00000000-0000-0000-0000-000000000000", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
	}, Spec: podSpec(nodeName(podNode(k)), w.name())}
	if w.anycast() {
		p.Annotations = map[string]string{flockAnycastKey: anycastIP(w).String()}
	}
	if k%addressesEvery == addressesEvery/2 {
		p.Annotations = map[string]string{flockAddressesKey: addressesIP(k).String()}
	}
	return p
}

func podSpec(node, app string) corev1.PodSpec {
	var env []corev1.EnvVar
	for e := range containerEnvVars {
		env = append(env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", e), Value: fmt.Sprintf("value-%d-of-%s", e, app)})
	}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString(appPortName)}},
		PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	return corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
		Name: "app", Image: "registry.example.com/" + app + ":v1.4.2",
		Ports:          []corev1.ContainerPort{{Name: appPortName, ContainerPort: appPort, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}},
		Env:            env,
		Resources:      corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("100m"), "memory": q("128Mi")}, Limits: corev1.ResourceList{"memory": q("256Mi")}},
		ReadinessProbe: probe, LivenessProbe: probe,
	}}, Tolerations: []corev1.Toleration{
		{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
		{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
	}}
}

// podStatus is kubelet's report of a running, ready pod with ips (none for
// the host network: the node's address).
func podStatus(p *corev1.Pod, hostIP netip.Addr, ips ...netip.Addr) {
	now := metav1.Now()
	st := &p.Status
	st.Phase, st.StartTime = corev1.PodRunning, &now
	st.HostIP, st.HostIPs = hostIP.String(), []corev1.HostIP{{IP: hostIP.String()}}
	if len(ips) == 0 {
		ips = []netip.Addr{hostIP}
	}
	st.PodIP, st.PodIPs = ips[0].String(), nil
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	st.Conditions = nil
	for _, c := range []corev1.PodConditionType{"PodReadyToStartContainers", corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	st.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image,
			ImageID: c.Image + "@sha256:" + fmt.Sprintf("%064x", fnvHash(c.Image)), ContainerID: "containerd://" + fmt.Sprintf("%064x", fnvHash(p.Name)),
			Ready: true, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
	}
}

// hostPodObj is node i's j-th host-network DaemonSet pod.
func hostPodObj(i, j int) *corev1.Pod {
	ds := []string{"kube-proxy", "flock", "flock-policy", "log-shipper"}[j%4]
	spec := podSpec(nodeName(i), ds)
	spec.HostNetwork = true
	spec.Containers[0].Ports = nil
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("%s-%s", ds, suffix(i)), Namespace: "kube-system",
		Labels: map[string]string{"app.kubernetes.io/name": ds, "controller-revision-hash": "6d5f8c7b9", "pod-template-generation": "1"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds,
			UID: "00000000-0000-0000-0000-000000000001", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
	}, Spec: spec}
}

func anycastIP(w workload) netip.Addr { return addOffset(anyV6Base, uint64(w.index)) }
func addressesIP(k int) netip.Addr    { return addOffset(addrV6Base, uint64(k)) }
func lbIP(w workload) netip.Addr      { return addOffset(lbV6Base, uint64(w.index)) }

// serviceObj is w's Service: IPv6 (the primary family) or, one in
// dualStackEvery, PreferDualStack; one in lbEvery a LoadBalancer of
// flock's class.
func serviceObj(w workload) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: w.name(), Namespace: w.namespace(), Labels: map[string]string{"app.kubernetes.io/name": w.name()}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": w.name()}, Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: appPortName, Port: 80, TargetPort: intstr.FromString(appPortName), Protocol: corev1.ProtocolTCP}}}}
	if w.dualStack() {
		s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	}
	if w.lb() {
		s.Spec.Type, s.Spec.LoadBalancerClass = corev1.ServiceTypeLoadBalancer, ptr.To(lbClass)
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	}
	return s
}

// endpointSlices are the EndpointSlice controller's slices for w (one
// family each, at most 100 endpoints a slice), given the Service's
// families.
func endpointSlices(w workload, families []corev1.IPFamily) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range families {
		at := discoveryv1.AddressTypeIPv6
		if fam == corev1.IPv4Protocol {
			at = discoveryv1.AddressTypeIPv4
		}
		for first := 0; first < w.size; first += 100 {
			es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("%s-%s-%d", w.name(), string(at)[2:], first/100), Namespace: w.namespace(),
				Labels: map[string]string{discoveryv1.LabelServiceName: w.name(), discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
					"app.kubernetes.io/name": w.name()},
			}, AddressType: at, Ports: []discoveryv1.EndpointPort{{Name: ptr.To(appPortName), Port: ptr.To[int32](appPort), Protocol: ptr.To(corev1.ProtocolTCP)}}}
			for k := w.first + first; k < w.first+min(w.size, first+100); k++ {
				v6, v4 := podIPs(k)
				ip := v6
				if at == discoveryv1.AddressTypeIPv4 {
					ip = v4
				}
				es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip.String()},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
					NodeName:   ptr.To(nodeName(podNode(k))), Zone: ptr.To(fmt.Sprintf("zone-%d", podNode(k)%3)),
					TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: w.namespace(), Name: w.podName(k)}})
			}
			out = append(out, es)
		}
	}
	return out
}

// policyObj is NetworkPolicy p, in namespace p (one a namespace): it
// selects one of the namespace's workloads and lets in its frontends and
// the monitoring namespace on the named port, and every other one also a
// range of addresses; every fourth also limits egress.
func policyObj(m *model, p int) *networkingv1.NetworkPolicy {
	w := m.workloads[min(p*servicesPerNS, len(m.workloads)-1)]
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%04d", modelPolicyPrefix, p), Namespace: w.namespace()},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": w.name()}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	port := networkingv1.NetworkPolicyPort{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromString(appPortName))}
	in := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{port}, From: []networkingv1.NetworkPolicyPeer{
		{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "frontend"}}},
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%d", p%50)}}},
	}}
	if p%2 == 1 {
		in.From = append(in.From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "2001:db8:7000::/48", Except: []string{"2001:db8:7000:1::/64"}}})
	}
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{in}
	if p%4 == 3 {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}}}
	}
	return np
}

// addressPools are the cluster's: anycast, addresses and LoadBalancer
// addresses from the model's ranges, open to every namespace.
func addressPools() []*flockv1.AddressPool {
	pool := func(name, cidr, use string) *flockv1.AddressPool {
		return &flockv1.AddressPool{TypeMeta: metav1.TypeMeta{APIVersion: flockv1.GroupVersion.String(), Kind: "AddressPool"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       flockv1.AddressPoolSpec{CIDRs: []string{cidr}, Use: []string{use}, NamespaceSelector: &metav1.LabelSelector{}}}
	}
	return []*flockv1.AddressPool{
		pool("scale-anycast", netip.PrefixFrom(anyV6Base, 64).String(), "anycast"),
		pool("scale-addresses", netip.PrefixFrom(addrV6Base, 64).String(), "addresses"),
		pool("scale-loadbalancers", netip.PrefixFrom(lbV6Base, 64).String(), "loadBalancer"),
	}
}

// podClaim is the AddressClaim an agent makes for pod k's `addresses` IP.
func podClaim(w workload, k int) *flockv1.AddressClaim {
	ip := addressesIP(k)
	return &flockv1.AddressClaim{TypeMeta: metav1.TypeMeta{APIVersion: flockv1.GroupVersion.String(), Kind: "AddressClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: claims.ClaimName(ip)},
		Spec: flockv1.AddressClaimSpec{IP: ip.String(), Use: "addresses", Pool: "scale-addresses",
			Pod:  &flockv1.ClaimPod{Namespace: w.namespace(), Name: w.podName(k)},
			Node: nodeName(podNode(k)), ContainerID: fmt.Sprintf("%064x", fnvHash(w.podName(k)))}}
}

// lbClaim is the AddressClaim the assigner makes for w's LoadBalancer
// address.
func lbClaim(w workload) *flockv1.AddressClaim {
	ip := lbIP(w)
	return &flockv1.AddressClaim{TypeMeta: metav1.TypeMeta{APIVersion: flockv1.GroupVersion.String(), Kind: "AddressClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: claims.ClaimName(ip)},
		Spec: flockv1.AddressClaimSpec{IP: ip.String(), Use: "loadBalancer", Pool: "scale-loadbalancers",
			Service: &flockv1.ClaimService{Namespace: w.namespace(), Name: w.name()}}}
}

// nodeConfigObj is model node i's NodeConfig, as a NodeConfigTemplate
// renders one: its summary, its router ID, a ToR peer.
func nodeConfigObj(i int) *flockv1.NodeConfig {
	rid := addOffset(netip.MustParseAddr("192.0.0.0"), uint64(i+1)) // a router ID is 32 bits, not an address
	return &flockv1.NodeConfig{TypeMeta: metav1.TypeMeta{APIVersion: flockv1.GroupVersion.String(), Kind: flockv1.NodeConfigKind},
		ObjectMeta: metav1.ObjectMeta{Name: nodeName(i), Labels: map[string]string{"flock.fritzlab.net/template": "racks"}},
		Spec: flockv1.NodeConfigSpec{ASN: 64512, RouterID: rid.String(),
			Pools:    []flockv1.Pool{{CIDR: nodeSummary(i).String()}},
			Defaults: flockv1.Defaults{IPv6: ptr.To(true), IPv4: true},
			BGP: flockv1.BGP{Peers: []flockv1.Peer{{Address: addOffset(nodeIP(i), 0x10000).String(), ASN: 64513,
				Families: []string{"ipv6", "ipv4"}}}}}}
}

// nodeConfigStatus is what node i's agent reports (agent/daemon/kube.go's
// nodeStatus on a healthy node): one peer up, Ready.
func nodeConfigStatus(i int) flockv1.NodeConfigStatus {
	since := created
	return flockv1.NodeConfigStatus{ObservedGeneration: 1,
		PeerStates:       []flockv1.PeerStatus{{Peer: addOffset(nodeIP(i), 0x10000).String(), State: "established", Since: &since}},
		PeersEstablished: 1, PeersConfigured: 1, Peers: "1/1",
		Conditions: []metav1.Condition{{Type: flockv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Serving",
			Message: "allocations recovered, CNI served, routes reconciled", LastTransitionTime: metav1.Now(), ObservedGeneration: 1}}}
}

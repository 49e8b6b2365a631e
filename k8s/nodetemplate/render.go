// Package nodetemplate renders NodeConfigTemplates into NodeConfigs: a
// whole rack peered without one hand-written NodeConfig per node.
//
// Every agent renders only its own node (Controller): it watches the
// templates and its own Node, and keeps the NodeConfig named after the
// node equal to Render(the one template selecting the node, the Node) —
// unless that NodeConfig is hand-made (no flock.fritzlab.net/template
// label), which is never touched and overrides every template. Render is
// pure: the per-node values come from the Node object only (labels,
// annotations, status.addresses, spec.podCIDRs).
package nodetemplate

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// RenderError is what keeps a template from rendering for a node: every
// problem, each naming the template, the field, the node and the value.
type RenderError struct {
	Template, Node string
	Problems       []string // "spec.asnFrom.label: node n1 has no label ..."
}

func (e *RenderError) Error() string {
	return fmt.Sprintf("NodeConfigTemplate %s: %s", e.Template, strings.Join(e.Problems, "; "))
}

// Render is the NodeConfig spec tpl gives node. It does not check that
// tpl selects node, nor validate the whole spec (the agent's
// nodeconfig.Validate does): it fills in the per-node values, and fails
// with a *RenderError when one is missing or malformed.
func Render(tpl *v1alpha1.NodeConfigTemplate, node *corev1.Node) (v1alpha1.NodeConfigSpec, error) {
	r := renderer{tpl: tpl, node: node}
	s := tpl.Spec
	var spec v1alpha1.NodeConfigSpec

	switch {
	case s.ASN != 0 && s.ASNFrom != nil:
		r.fail("spec.asn and spec.asnFrom: set only one")
	case s.ASN != 0:
		spec.ASN = s.ASN
	case s.ASNFrom != nil:
		if f, v, ok := r.value("spec.asnFrom", *s.ASNFrom); ok {
			asn, err := strconv.ParseUint(v, 10, 32)
			if err != nil || asn == 0 || asn == 4294967295 {
				r.fail("%s: node %s: %s is not an AS number (1..4294967294)", f, node.Name, r.describe(*s.ASNFrom, v))
			} else {
				spec.ASN = uint32(asn)
			}
		}
	default:
		r.fail("spec.asn: set asn or asnFrom")
	}

	spec.RouterID = r.routerID()
	spec.Pools = r.pools()

	spec.Defaults = *s.Template.Defaults.DeepCopy()
	if spec.Defaults.IPv6 == nil { // the CRD's default, so the rendered object reads back equal
		yes := true
		spec.Defaults.IPv6 = &yes
	}
	b := s.Template.BGP
	spec.BGP.ListenPort = b.ListenPort
	spec.BGP.ImportPolicy = b.ImportPolicy
	if spec.BGP.ImportPolicy == "" {
		spec.BGP.ImportPolicy = "reject" // the CRD's default
	}
	for i := range b.Peers {
		if p, ok := r.peer(i, &b.Peers[i]); ok {
			spec.BGP.Peers = append(spec.BGP.Peers, p)
		}
	}
	if len(r.problems) > 0 {
		return v1alpha1.NodeConfigSpec{}, &RenderError{Template: tpl.Name, Node: node.Name, Problems: r.problems}
	}
	return spec, nil
}

type renderer struct {
	tpl      *v1alpha1.NodeConfigTemplate
	node     *corev1.Node
	problems []string
}

func (r *renderer) fail(format string, a ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, a...))
}

// value reads a label or annotation; f is the field the value was read
// for ("spec.asnFrom.label"). A missing one is a problem.
func (r *renderer) value(field string, from v1alpha1.ValueFrom) (f, v string, ok bool) {
	return r.labelOrAnnotation(field, from.Label, from.Annotation)
}

func (r *renderer) labelOrAnnotation(field, label, annotation string) (f, v string, ok bool) {
	switch {
	case label != "" && annotation != "":
		r.fail("%s: set only one of label and annotation", field)
	case label != "":
		f = field + ".label"
		if v, ok = r.node.Labels[label]; !ok {
			r.fail("%s: node %s has no label %s", f, r.node.Name, label)
		}
	case annotation != "":
		f = field + ".annotation"
		if v, ok = r.node.Annotations[annotation]; !ok {
			r.fail("%s: node %s has no annotation %s", f, r.node.Name, annotation)
		}
	default:
		r.fail("%s: set label or annotation", field)
	}
	return f, v, ok
}

// describe shows where a value came from: `label flock.fritzlab.net/asn="x"`.
func (r *renderer) describe(from v1alpha1.ValueFrom, v string) string {
	if from.Label != "" {
		return fmt.Sprintf("label %s=%q", from.Label, v)
	}
	return fmt.Sprintf("annotation %s=%q", from.Annotation, v)
}

// nodeAddress is the node's first InternalIP of the family kind names.
func (r *renderer) nodeAddress(f, kind string) (netip.Addr, bool) {
	var want4 bool
	switch kind {
	case v1alpha1.NodeAddressInternalIPv4:
		want4 = true
	case v1alpha1.NodeAddressInternalIPv6:
	default:
		r.fail("%s: %q, want %s or %s", f, kind, v1alpha1.NodeAddressInternalIPv6, v1alpha1.NodeAddressInternalIPv4)
		return netip.Addr{}, false
	}
	var have []string
	for _, a := range r.node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		have = append(have, a.Address)
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Zone() == "" && ip.Unmap().Is4() == want4 {
			return ip.Unmap(), true
		}
	}
	fam := "IPv6"
	if want4 {
		fam = "IPv4"
	}
	r.fail("%s: node %s has no %s InternalIP (its InternalIPs: [%s])", f, r.node.Name, fam, strings.Join(have, " "))
	return netip.Addr{}, false
}

func (r *renderer) routerID() string {
	from := r.tpl.Spec.RouterIDFrom
	n := 0
	for _, s := range []string{from.NodeAddress, from.Label, from.Annotation, from.Hash} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		r.fail("spec.routerIDFrom: set exactly one of nodeAddress, label, annotation and hash")
		return ""
	}
	switch {
	case from.NodeAddress != "":
		f := "spec.routerIDFrom.nodeAddress"
		if from.NodeAddress != v1alpha1.NodeAddressInternalIPv4 {
			r.fail("%s: %q, want %s (a router ID is 32 bits)", f, from.NodeAddress, v1alpha1.NodeAddressInternalIPv4)
			return ""
		}
		if ip, ok := r.nodeAddress(f, from.NodeAddress); ok {
			return ip.String()
		}
	case from.Hash != "":
		if from.Hash != v1alpha1.HashNodeName {
			r.fail("spec.routerIDFrom.hash: %q, want %s", from.Hash, v1alpha1.HashNodeName)
			return ""
		}
		return HashRouterID(r.node.Name)
	default:
		vf := v1alpha1.ValueFrom{Label: from.Label, Annotation: from.Annotation}
		if f, v, ok := r.value("spec.routerIDFrom", vf); ok {
			ip, err := netip.ParseAddr(v)
			if err != nil || !ip.Is4() || ip.IsUnspecified() {
				r.fail("%s: node %s: %s is not a router ID (a dotted quad other than 0.0.0.0)", f, r.node.Name, r.describe(vf, v))
				return ""
			}
			return ip.String()
		}
	}
	return ""
}

// HashRouterID is the router ID routerIDFrom.hash: NodeName gives node: the
// 32 bits of FNV-1a of its name as a dotted quad (never 0.0.0.0).
func HashRouterID(node string) string {
	h := fnv.New32a()
	h.Write([]byte(node))
	v := h.Sum32()
	if v == 0 {
		v = 1
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

func (r *renderer) pools() []v1alpha1.Pool {
	from := r.tpl.Spec.PoolsFrom
	if !from.PodCIDRs && from.Annotation == "" {
		r.fail("spec.poolsFrom: set podCIDRs: true and/or annotation")
		return nil
	}
	var out []v1alpha1.Pool
	add := func(f, what, v string) {
		p, err := netip.ParsePrefix(strings.TrimSpace(v))
		switch {
		case err != nil:
			r.fail("%s: node %s: %s: %q is not a CIDR", f, r.node.Name, what, v)
		case p.Masked() != p:
			r.fail("%s: node %s: %s: %q has host bits set", f, r.node.Name, what, v)
		case slices.ContainsFunc(out, func(q v1alpha1.Pool) bool { return q.CIDR == p.String() }):
			// podCIDRs and the annotation name the same: once is enough.
		default:
			out = append(out, v1alpha1.Pool{CIDR: p.String()})
		}
	}
	if from.PodCIDRs {
		f := "spec.poolsFrom.podCIDRs"
		cidrs := r.node.Spec.PodCIDRs
		if len(cidrs) == 0 && r.node.Spec.PodCIDR != "" {
			cidrs = []string{r.node.Spec.PodCIDR}
		}
		if len(cidrs) == 0 {
			r.fail("%s: node %s has no spec.podCIDRs (kube-controller-manager allocates them with --allocate-node-cidrs and --cluster-cidr)", f, r.node.Name)
		}
		for i, c := range cidrs {
			add(f, fmt.Sprintf("spec.podCIDRs[%d]", i), c)
		}
	}
	if from.Annotation != "" {
		f := "spec.poolsFrom.annotation"
		v, ok := r.node.Annotations[from.Annotation]
		switch {
		case !ok:
			r.fail("%s: node %s has no annotation %s", f, r.node.Name, from.Annotation)
		case strings.TrimSpace(v) == "":
			r.fail("%s: node %s: annotation %s=%q holds no CIDR", f, r.node.Name, from.Annotation, v)
		default:
			for _, c := range strings.Split(v, ",") {
				add(f, "annotation "+from.Annotation, c)
			}
		}
	}
	return out
}

// peer renders spec.template.bgp.peers[i].
func (r *renderer) peer(i int, tp *v1alpha1.TemplatePeer) (v1alpha1.Peer, bool) {
	field := fmt.Sprintf("spec.template.bgp.peers[%d]", i)
	before := len(r.problems)
	p := *tp.Peer.DeepCopy()
	n := 0
	for _, set := range []bool{p.Address != "", p.Interface != "", tp.AddressFrom != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		r.fail("%s: set exactly one of address, interface (unnumbered) and addressFrom", field)
	}
	if tp.AddressFrom != nil && n == 1 {
		if f, v, ok := r.value(field+".addressFrom", *tp.AddressFrom); ok {
			ip, err := netip.ParseAddr(v)
			if err != nil || ip.Zone() != "" {
				r.fail("%s: node %s: %s is not an IP address", f, r.node.Name, r.describe(*tp.AddressFrom, v))
			} else {
				p.Address = ip.String()
			}
		}
	}
	if lf := tp.LocalAddressFrom; lf != nil {
		field := field + ".localAddressFrom"
		switch {
		case p.LocalAddress != "":
			r.fail("%s: set only one of localAddress and localAddressFrom", field)
		case lf.NodeAddress != "" && (lf.Label != "" || lf.Annotation != ""):
			r.fail("%s: set exactly one of nodeAddress, label and annotation", field)
		case lf.NodeAddress != "":
			if ip, ok := r.nodeAddress(field+".nodeAddress", lf.NodeAddress); ok {
				p.LocalAddress = ip.String()
			}
		default:
			vf := v1alpha1.ValueFrom{Label: lf.Label, Annotation: lf.Annotation}
			if f, v, ok := r.value(field, vf); ok {
				ip, err := netip.ParseAddr(v)
				if err != nil || ip.Zone() != "" {
					r.fail("%s: node %s: %s is not an IP address", f, r.node.Name, r.describe(vf, v))
				} else {
					p.LocalAddress = ip.String()
				}
			}
		}
	}
	return p, len(r.problems) == before
}

// IsRenderError tells a template's (or a node's) problem from an API one.
func IsRenderError(err error) bool {
	var re *RenderError
	return errors.As(err, &re)
}

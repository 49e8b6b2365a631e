package v1alpha1_test

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

var templateCRDPath = filepath.Join("..", "..", "..", "deploy", "crd", "flock.fritzlab.net_nodeconfigtemplates.yaml")

func TestNodeConfigTemplateCRD(t *testing.T) {
	c := loadCRD(t, templateCRDPath)
	checkIdentity(t, c, v1alpha1.NodeConfigTemplateKind, v1alpha1.NodeConfigTemplateResource, "nct")
	v := c.Spec.Versions[0]
	// The agents count the rendered NodeConfigs in the status.
	if _, ok := v.Subresources["status"]; !ok {
		t.Errorf("no status subresource: %v", v.Subresources)
	}
	checkColumns(t, v.AdditionalPrinterColumns, []printerColumn{
		{"Selector", "string", ".spec.nodeSelector", 0},
		{"ASN", "integer", ".spec.asn", 0},
		{"Nodes", "integer", ".status.nodes", 0},
		{"ASN-From", "string", ".spec.asnFrom", 1},
		{"Router-ID-From", "string", ".spec.routerIDFrom", 1},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	})
	root := v.Schema.OpenAPIV3Schema
	// The name is a label value of the rendered NodeConfigs.
	if r := "self.metadata.name.size() <= 63"; !hasRule(root, r) {
		t.Errorf("root rules %+v lack %q", root.Validations, r)
	}
	spec := root.Properties["spec"]
	for _, f := range []string{"nodeSelector", "routerIDFrom", "poolsFrom"} {
		if !slices.Contains(spec.Required, f) {
			t.Errorf("spec.%s not required (required: %v)", f, spec.Required)
		}
	}
	// What must be unique per node has no literal.
	for _, f := range []string{"routerID", "pools"} {
		if _, ok := spec.Properties[f]; ok {
			t.Errorf("spec.%s exists: a literal would be the same on every node", f)
		}
	}
	for _, c := range []struct {
		at   string
		s    schema
		rule string
	}{
		{"spec", spec, "has(self.asn) != has(self.asnFrom)"},
		{"spec.asnFrom", spec.Properties["asnFrom"], "has(self.label) != has(self.annotation)"},
		{"spec.routerIDFrom", spec.Properties["routerIDFrom"], "(has(self.nodeAddress) ? 1 : 0) + (has(self.label) ? 1 : 0) + (has(self.annotation) ? 1 : 0) + (has(self.hash) ? 1 : 0) == 1"},
		{"spec.poolsFrom", spec.Properties["poolsFrom"], "(has(self.podCIDRs) && self.podCIDRs) || has(self.annotation)"},
	} {
		if !hasRule(c.s, c.rule) {
			t.Errorf("%s rules %+v lack %q", c.at, c.s.Validations, c.rule)
		}
	}
	if e := spec.Properties["routerIDFrom"].Properties["nodeAddress"].Enum; !reflect.DeepEqual(e, []any{v1alpha1.NodeAddressInternalIPv4}) {
		t.Errorf("routerIDFrom.nodeAddress enum %v: a router ID is 32 bits", e)
	}
	if e := spec.Properties["routerIDFrom"].Properties["hash"].Enum; !reflect.DeepEqual(e, []any{v1alpha1.HashNodeName}) {
		t.Errorf("routerIDFrom.hash enum %v", e)
	}
	asn := spec.Properties["asn"]
	if asn.Minimum == nil || *asn.Minimum != 1 || asn.Maximum == nil || *asn.Maximum != 4294967294 || asn.Format == "int32" {
		t.Errorf("asn schema %+v", asn)
	}
	if _, ok := spec.Properties["nodeSelector"].Properties["matchExpressions"]; !ok {
		t.Error("spec.nodeSelector is not a label selector")
	}

	peer := spec.Properties["template"].Properties["bgp"].Properties["peers"].Items
	if peer == nil {
		t.Fatal("no spec.template.bgp.peers items")
	}
	for _, r := range []string{
		"(has(self.address) ? 1 : 0) + (has(self.interface) ? 1 : 0) + (has(self.addressFrom) ? 1 : 0) == 1",
		"!has(self.localAddress) || !has(self.localAddressFrom)",
	} {
		if !hasRule(*peer, r) {
			t.Errorf("template peer rules lack %q", r)
		}
	}
	// NodeConfig's "address or interface" would refuse addressFrom.
	if hasRule(*peer, "has(self.address) != has(self.interface)") {
		t.Error("template peers inherit NodeConfig's address-or-interface rule: addressFrom peers would be refused")
	}
	if e := peer.Properties["localAddressFrom"].Properties["nodeAddress"].Enum; !reflect.DeepEqual(e, []any{v1alpha1.NodeAddressInternalIPv6, v1alpha1.NodeAddressInternalIPv4}) {
		t.Errorf("localAddressFrom.nodeAddress enum %v", e)
	}
	// A template peer is a NodeConfig peer plus addressFrom and
	// localAddressFrom: every field of Peer with the same schema, every
	// other rule of Peer too.
	ncPeer := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["bgp"].Properties["peers"].Items
	for name, s := range ncPeer.Properties {
		if !reflect.DeepEqual(peer.Properties[name], s) {
			t.Errorf("template peer field %s differs from the NodeConfig peer's:\n%+v\n%+v", name, peer.Properties[name], s)
		}
	}
	for name := range peer.Properties {
		if _, ok := ncPeer.Properties[name]; !ok && name != "addressFrom" && name != "localAddressFrom" {
			t.Errorf("template peer field %s: not a NodeConfig peer's", name)
		}
	}
	for _, r := range ncPeer.Validations {
		if r.Rule != "has(self.address) != has(self.interface)" && !hasRule(*peer, r.Rule) {
			t.Errorf("template peers lack the NodeConfig peer rule %q", r.Rule)
		}
	}
	// The rest of the template is the NodeConfig's.
	ncSpec := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	if !reflect.DeepEqual(spec.Properties["template"].Properties["defaults"], ncSpec.Properties["defaults"]) {
		t.Error("spec.template.defaults differs from the NodeConfig's defaults")
	}
	for _, f := range []string{"listenPort", "importPolicy"} {
		got, want := spec.Properties["template"].Properties["bgp"].Properties[f], ncSpec.Properties["bgp"].Properties[f]
		if !reflect.DeepEqual(got, want) {
			t.Errorf("spec.template.bgp.%s %+v differs from the NodeConfig's %+v", f, got, want)
		}
	}
	if s := root.Properties["status"].Properties["nodes"]; s.Type != "integer" {
		t.Errorf("status.nodes type %q", s.Type)
	}
}

// TestTemplateCRDMatchesTypes: every JSON field of NodeConfigTemplate
// (embedded structs inlined) is in the CRD schema and vice versa.
func TestTemplateCRDMatchesTypes(t *testing.T) {
	root := loadCRD(t, templateCRDPath).Spec.Versions[0].Schema.OpenAPIV3Schema
	typ := reflect.TypeOf(v1alpha1.NodeConfigTemplate{})
	for _, top := range []string{"Spec", "Status"} {
		f, _ := typ.FieldByName(top)
		compareInline(t, "NodeConfigTemplate."+strings.ToLower(top), f.Type, root.Properties[strings.ToLower(top)])
	}
}

// compareInline is compareFields with embedded (inline) structs.
func compareInline(t *testing.T, path string, typ reflect.Type, s schema) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if skipTypes[typ] || typ == reflect.TypeOf(metav1.LabelSelector{}) {
		return
	}
	switch typ.Kind() {
	case reflect.Slice:
		if s.Items == nil {
			t.Errorf("%s: Go slice, schema without items", path)
			return
		}
		compareInline(t, path+"[]", typ.Elem(), *s.Items)
		return
	case reflect.Struct:
	default:
		return
	}
	seen := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" && opts == "inline" && f.Anonymous {
				walk(f.Type)
				continue
			}
			if name == "" || name == "-" {
				continue
			}
			seen[name] = true
			sub, ok := s.Properties[name]
			if !ok {
				t.Errorf("%s.%s: in the Go type, not in the CRD (run make generate)", path, name)
				continue
			}
			compareInline(t, path+"."+name, f.Type, sub)
		}
	}
	walk(typ)
	for name := range s.Properties {
		if !seen[name] {
			t.Errorf("%s.%s: in the CRD, not in the Go type (run make generate)", path, name)
		}
	}
}

func TestTemplateSchemeAndDeepCopy(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{&v1alpha1.NodeConfigTemplate{}, &v1alpha1.NodeConfigTemplateList{}} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil {
			t.Fatal(err)
		}
		if gvks[0].GroupVersion() != v1alpha1.GroupVersion {
			t.Errorf("%T registered as %v", obj, gvks[0])
		}
	}
	yes := true
	tpl := &v1alpha1.NodeConfigTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "rack1"},
		Spec: v1alpha1.NodeConfigTemplateSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"rack": "1"}},
			ASNFrom:      &v1alpha1.ValueFrom{Label: "asn"},
			RouterIDFrom: v1alpha1.RouterIDFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv4},
			PoolsFrom:    v1alpha1.PoolsFrom{PodCIDRs: true},
			Template: v1alpha1.TemplateSpec{Defaults: v1alpha1.Defaults{IPv6: &yes}, BGP: v1alpha1.TemplateBGP{Peers: []v1alpha1.TemplatePeer{{
				Peer:             v1alpha1.Peer{ASN: 64513, Families: []string{"ipv6"}},
				AddressFrom:      &v1alpha1.ValueFrom{Annotation: "tor"},
				LocalAddressFrom: &v1alpha1.AddressFrom{NodeAddress: v1alpha1.NodeAddressInternalIPv6},
			}}}},
		},
		Status: v1alpha1.NodeConfigTemplateStatus{Nodes: 3},
	}
	cp := tpl.DeepCopyObject().(*v1alpha1.NodeConfigTemplate)
	if !reflect.DeepEqual(tpl, cp) {
		t.Fatalf("copy differs:\n%+v\n%+v", tpl, cp)
	}
	cp.Spec.NodeSelector.MatchLabels["rack"] = "2"
	cp.Spec.ASNFrom.Label = "x"
	cp.Spec.Template.BGP.Peers[0].Families[0] = "ipv4"
	cp.Spec.Template.BGP.Peers[0].AddressFrom.Annotation = "y"
	cp.Spec.Template.BGP.Peers[0].LocalAddressFrom.NodeAddress = "z"
	*cp.Spec.Template.Defaults.IPv6 = false
	p := tpl.Spec.Template.BGP.Peers[0]
	if tpl.Spec.NodeSelector.MatchLabels["rack"] != "1" || tpl.Spec.ASNFrom.Label != "asn" || p.Families[0] != "ipv6" ||
		p.AddressFrom.Annotation != "tor" || p.LocalAddressFrom.NodeAddress != v1alpha1.NodeAddressInternalIPv6 || !*tpl.Spec.Template.Defaults.IPv6 {
		t.Error("the copy shares memory with the original")
	}
	if l := (&v1alpha1.NodeConfigTemplateList{Items: []v1alpha1.NodeConfigTemplate{*tpl}}); !reflect.DeepEqual(l, l.DeepCopyObject()) {
		t.Error("list copy differs")
	}
}

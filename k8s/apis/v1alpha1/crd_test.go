package v1alpha1_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// The CRDs `make generate` writes from this package.
var (
	crdPath      = filepath.Join("..", "..", "..", "deploy", "crd", "flock.fritzlab.net_nodeconfigs.yaml")
	poolCRDPath  = filepath.Join("..", "..", "..", "deploy", "crd", "flock.fritzlab.net_addresspools.yaml")
	claimCRDPath = filepath.Join("..", "..", "..", "deploy", "crd", "flock.fritzlab.net_addressclaims.yaml")
)

// The subset of apiextensions.k8s.io/v1 the tests read (the module does not
// depend on apiextensions-apiserver).
type crd struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Kind       string   `json:"kind"`
			ListKind   string   `json:"listKind"`
			Plural     string   `json:"plural"`
			Singular   string   `json:"singular"`
			ShortNames []string `json:"shortNames"`
		} `json:"names"`
		Scope    string `json:"scope"`
		Versions []struct {
			Name                     string          `json:"name"`
			Served                   bool            `json:"served"`
			Storage                  bool            `json:"storage"`
			AdditionalPrinterColumns []printerColumn `json:"additionalPrinterColumns"`
			Subresources             map[string]any  `json:"subresources"`
			Schema                   struct {
				OpenAPIV3Schema schema `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

type printerColumn struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	JSONPath string `json:"jsonPath"`
	Priority int32  `json:"priority"`
}

type schema struct {
	Type        string            `json:"type"`
	Format      string            `json:"format"`
	Properties  map[string]schema `json:"properties"`
	Items       *schema           `json:"items"`
	Required    []string          `json:"required"`
	Enum        []any             `json:"enum"`
	Pattern     string            `json:"pattern"`
	Minimum     *float64          `json:"minimum"`
	Maximum     *float64          `json:"maximum"`
	MinItems    *int              `json:"minItems"`
	MaxItems    *int              `json:"maxItems"`
	MinLength   *int              `json:"minLength"`
	MaxLength   *int              `json:"maxLength"`
	ListType    string            `json:"x-kubernetes-list-type"`
	ListMapKeys []string          `json:"x-kubernetes-list-map-keys"`
	Validations []struct {
		Rule      string `json:"rule"`
		Message   string `json:"message"`
		FieldPath string `json:"fieldPath"`
	} `json:"x-kubernetes-validations"`
}

// loadCRD reads the NodeConfig CRD, or the one at path.
func loadCRD(t *testing.T, path ...string) *crd {
	t.Helper()
	p := crdPath
	if len(path) > 0 {
		p = path[0]
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run make generate)", err)
	}
	var c crd
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return &c
}

func TestCRDIdentity(t *testing.T) {
	c := loadCRD(t)
	checkIdentity(t, c, v1alpha1.NodeConfigKind, v1alpha1.NodeConfigResource, "nc")
	if v := c.Spec.Versions[0]; v.Subresources["status"] == nil {
		t.Errorf("no status subresource: %v", v.Subresources)
	}
}

func TestCRDPrinterColumns(t *testing.T) {
	v := loadCRD(t).Spec.Versions[0]
	type col struct {
		name, typ, path string
		priority        int32
	}
	want := []col{
		{"ASN", "integer", ".spec.asn", 0},
		{"Router ID", "string", ".spec.routerID", 0},
		{"Ready", "string", `.status.conditions[?(@.type=="Ready")].status`, 0},
		{"Peers", "string", ".status.peers", 0},
		{"Reason", "string", `.status.conditions[?(@.type=="Ready")].reason`, 1},
		{"Last Error", "string", ".status.lastError", 1},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	}
	var got []col
	for _, c := range v.AdditionalPrinterColumns {
		got = append(got, col{c.Name, c.Type, c.JSONPath, c.Priority})
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("printer columns\n got %+v\nwant %+v", got, want)
	}
}

// checkIdentity checks a CRD's name, group, names, scope (Cluster) and its
// one served and stored version.
func checkIdentity(t *testing.T, c *crd, kind, plural, shortName string) {
	t.Helper()
	if c.APIVersion != "apiextensions.k8s.io/v1" || c.Kind != "CustomResourceDefinition" {
		t.Errorf("apiVersion/kind = %s %s", c.APIVersion, c.Kind)
	}
	if want := plural + "." + v1alpha1.GroupName; c.Metadata.Name != want {
		t.Errorf("name = %q, want %q", c.Metadata.Name, want)
	}
	if c.Spec.Group != v1alpha1.GroupVersion.Group {
		t.Errorf("group = %q, want %q", c.Spec.Group, v1alpha1.GroupVersion.Group)
	}
	n := c.Spec.Names
	if n.Kind != kind || n.ListKind != kind+"List" || n.Plural != plural || n.Singular != strings.ToLower(kind) {
		t.Errorf("names = %+v, want kind %s, plural %s", n, kind, plural)
	}
	if !slices.Equal(n.ShortNames, []string{shortName}) {
		t.Errorf("shortNames = %v, want [%s]", n.ShortNames, shortName)
	}
	if c.Spec.Scope != "Cluster" {
		t.Errorf("scope = %q, want Cluster", c.Spec.Scope)
	}
	if len(c.Spec.Versions) != 1 {
		t.Fatalf("%d versions, want 1", len(c.Spec.Versions))
	}
	v := c.Spec.Versions[0]
	if v.Name != v1alpha1.GroupVersion.Version || !v.Served || !v.Storage {
		t.Errorf("version %q served=%v storage=%v", v.Name, v.Served, v.Storage)
	}
}

func checkColumns(t *testing.T, got []printerColumn, want []printerColumn) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("printer columns\n got %+v\nwant %+v", got, want)
	}
}

func hasRule(s schema, rule string) bool {
	for _, v := range s.Validations {
		if v.Rule == rule {
			return true
		}
	}
	return false
}

func TestAddressPoolCRD(t *testing.T) {
	c := loadCRD(t, poolCRDPath)
	checkIdentity(t, c, v1alpha1.AddressPoolKind, v1alpha1.AddressPoolResource, "ap")
	v := c.Spec.Versions[0]
	// Agents write the claims count through the status subresource.
	if _, ok := v.Subresources["status"]; !ok {
		t.Errorf("no status subresource: %v", v.Subresources)
	}
	checkColumns(t, v.AdditionalPrinterColumns, []printerColumn{
		{"CIDRs", "string", ".spec.cidrs", 0},
		{"Use", "string", ".spec.use", 0},
		{"Namespaces", "string", ".spec.namespaces", 0},
		{"Ready", "string", `.status.conditions[?(@.type=="Ready")].status`, 0},
		{"Claims", "integer", ".status.claims", 0},
		{"In-Use-On", "string", ".status.inUse[*].node", 0},
		{"Reason", "string", `.status.conditions[?(@.type=="Ready")].reason`, 1},
		{"Message", "string", `.status.conditions[?(@.type=="Ready")].message`, 1},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	})

	root := v.Schema.OpenAPIV3Schema
	if !slices.Contains(root.Required, "spec") {
		t.Errorf("spec not required (required: %v)", root.Required)
	}
	spec := root.Properties["spec"]
	for _, f := range []string{"cidrs", "use"} {
		if !slices.Contains(spec.Required, f) {
			t.Errorf("spec.%s not required (required: %v)", f, spec.Required)
		}
	}
	// Who may use the pool must be said: an omission is no silent "nobody".
	if r := "has(self.namespaces) || has(self.namespaceSelector)"; !hasRule(spec, r) {
		t.Errorf("spec rules %+v lack %q", spec.Validations, r)
	}
	cidrs := spec.Properties["cidrs"]
	if cidrs.MinItems == nil || *cidrs.MinItems != 1 || cidrs.MaxItems == nil || cidrs.Items == nil {
		t.Fatalf("spec.cidrs schema %+v, want 1..N items", cidrs)
	}
	for _, r := range []string{"isCIDR(self)", "!isCIDR(self) || cidr(self) == cidr(self).masked()"} {
		if !hasRule(*cidrs.Items, r) {
			t.Errorf("spec.cidrs[] rules %+v lack %q", cidrs.Items.Validations, r)
		}
	}
	if l := cidrs.Items.MaxLength; l == nil || *l < len("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128") {
		t.Errorf("spec.cidrs[] maxLength %v: too short for an IPv6 CIDR", l)
	}
	use := spec.Properties["use"]
	if use.MinItems == nil || *use.MinItems != 1 || use.Items == nil || use.ListType != "set" {
		t.Fatalf("spec.use schema %+v, want a set of at least one", use)
	}
	var uses []any
	for _, u := range v1alpha1.Uses {
		uses = append(uses, u)
	}
	if !reflect.DeepEqual(use.Items.Enum, uses) {
		t.Errorf("spec.use[] enum %v, want %v", use.Items.Enum, uses)
	}
	ns := spec.Properties["namespaces"]
	if ns.Items == nil || ns.Items.MinLength == nil || *ns.Items.MinLength != 1 || ns.Items.MaxLength == nil || *ns.Items.MaxLength != 63 {
		t.Errorf("spec.namespaces[] schema %+v, want 1..63 characters", ns.Items)
	}
	if ns.Items != nil && ns.Items.Pattern != `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$` {
		t.Errorf("spec.namespaces[] pattern %q, want a DNS-1123 label's", ns.Items.Pattern)
	}
	sel := spec.Properties["namespaceSelector"]
	if _, ok := sel.Properties["matchLabels"]; !ok {
		t.Errorf("spec.namespaceSelector is not a label selector: %+v", sel)
	}
	if _, ok := sel.Properties["matchExpressions"]; !ok {
		t.Errorf("spec.namespaceSelector is not a label selector: %+v", sel)
	}
	if s := root.Properties["status"].Properties["claims"]; s.Type != "integer" {
		t.Errorf("status.claims type %q", s.Type)
	}
	// The Ready condition, one per type.
	conds := root.Properties["status"].Properties["conditions"]
	if conds.ListType != "map" || !slices.Equal(conds.ListMapKeys, []string{"type"}) || conds.Items == nil ||
		!slices.Contains(conds.Items.Required, "reason") {
		t.Errorf("status.conditions schema %+v, want metav1.Conditions keyed by type", conds)
	}
	// One entry per node, each agent writing its own: a map list keyed by
	// node (a server-side apply or merge never replaces another node's).
	inUse := root.Properties["status"].Properties["inUse"]
	if inUse.ListType != "map" || !slices.Equal(inUse.ListMapKeys, []string{"node"}) || inUse.Items == nil {
		t.Fatalf("status.inUse schema %+v, want a map list keyed by node", inUse)
	}
	addrs := inUse.Items.Properties["addresses"]
	if addrs.MaxItems == nil || *addrs.MaxItems != v1alpha1.MaxInUseListed || addrs.Items == nil {
		t.Fatalf("status.inUse[].addresses schema %+v, want at most %d", addrs, v1alpha1.MaxInUseListed)
	}
	if e := addrs.Items.Properties["use"].Enum; !reflect.DeepEqual(e, []any{v1alpha1.UseAnycast, v1alpha1.UseAddresses}) {
		t.Errorf("status.inUse[].addresses[].use enum %v", e)
	}
}

func TestAddressClaimCRD(t *testing.T) {
	c := loadCRD(t, claimCRDPath)
	checkIdentity(t, c, v1alpha1.AddressClaimKind, v1alpha1.AddressClaimResource, "aclaim")
	v := c.Spec.Versions[0]
	// A claim has no status: it is created whole and deleted.
	if _, ok := v.Subresources["status"]; ok {
		t.Errorf("status subresource on AddressClaim: %v", v.Subresources)
	}
	checkColumns(t, v.AdditionalPrinterColumns, []printerColumn{
		{"IP", "string", ".spec.ip", 0},
		{"Use", "string", ".spec.use", 0},
		{"Pool", "string", ".spec.pool", 0},
		{"Namespace", "string", ".spec['pod','service'].namespace", 0},
		{"Pod", "string", ".spec.pod.name", 0},
		{"Service", "string", ".spec.service.name", 0},
		{"Node", "string", ".spec.node", 0},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	})
	root := v.Schema.OpenAPIV3Schema
	if _, ok := root.Properties["status"]; ok {
		t.Error("AddressClaim has a status in its schema")
	}
	spec := root.Properties["spec"]
	// A claim is held by a pod or by a Service: the holder's fields are
	// optional in the schema, the rules below say which go together.
	if want := []string{"ip", "use"}; !reflect.DeepEqual(spec.Required, want) {
		t.Errorf("spec required %v, want %v", spec.Required, want)
	}
	if !hasRule(spec.Properties["ip"], "isIP(self)") {
		t.Errorf("spec.ip rules %+v lack isIP(self)", spec.Properties["ip"].Validations)
	}
	// Anycast is shared by design and never claimed; externalIP is shared
	// between Services.
	if e := spec.Properties["use"].Enum; !reflect.DeepEqual(e, []any{v1alpha1.UsePod, v1alpha1.UseAddresses, v1alpha1.UseLoadBalancer}) {
		t.Errorf("spec.use enum %v, want [pod addresses loadBalancer]", e)
	}
	for _, holder := range []string{"pod", "service"} {
		s := spec.Properties[holder]
		for _, f := range []string{"namespace", "name"} {
			if !slices.Contains(s.Required, f) {
				t.Errorf("spec.%s.%s not required (required: %v)", holder, f, s.Required)
			}
		}
		if slices.Contains(s.Required, "uid") {
			t.Errorf("spec.%s.uid required", holder)
		}
	}
	// The holder rules (evaluated against the API server's CEL validator
	// when they were written: a pod's claim with service, or without pod,
	// node or containerID, is refused; a loadBalancer claim without
	// service, or with pod, node or containerID, is refused).
	for _, r := range []struct{ rule, fieldPath string }{
		{"(self.use == 'loadBalancer') == has(self.service)", ".service"},
		{"self.use != 'loadBalancer' || (!has(self.pod) && !has(self.node) && !has(self.containerID))", ""},
		{"self.use == 'loadBalancer' || (has(self.pod) && has(self.node) && has(self.containerID))", ""},
		// Sharing is a Service's: a pod's claim names no key or sharers,
		// and sharers always name the key they share under.
		{"self.use == 'loadBalancer' || (!has(self.sharingKey) && !has(self.sharers))", ""},
		{"!has(self.sharers) || (has(self.sharingKey) && size(self.sharingKey) > 0)", ".sharers"},
		// Updates (the agents may update claims, for shared addresses'
		// holders): the IP and use never change, a pod's claim not at all
		// (the e2e's Services test has the API server refuse both).
		{"self.ip == oldSelf.ip && self.use == oldSelf.use", ""},
		{"oldSelf.use == 'loadBalancer' || self == oldSelf", ""},
	} {
		found := false
		for _, v := range spec.Validations {
			if v.Rule == r.rule {
				found = true
				if v.FieldPath != r.fieldPath || v.Message == "" {
					t.Errorf("spec rule %q: fieldPath %q, message %q; want fieldPath %q and a message", r.rule, v.FieldPath, v.Message, r.fieldPath)
				}
			}
		}
		if !found {
			t.Errorf("spec rules %+v lack %q", spec.Validations, r.rule)
		}
	}
	if len(spec.Validations) != 7 {
		t.Errorf("%d spec rules, want 7", len(spec.Validations))
	}
}

func TestCRDValidation(t *testing.T) {
	root := loadCRD(t).Spec.Versions[0].Schema.OpenAPIV3Schema
	spec := root.Properties["spec"]
	peer := spec.Properties["bgp"].Properties["peers"].Items
	if peer == nil {
		t.Fatal("no spec.bgp.peers items schema")
	}
	hasRule := func(s schema, rule string) bool {
		for _, v := range s.Validations {
			if v.Rule == rule {
				return true
			}
		}
		return false
	}
	// `interface` is not among the CEL reserved words Kubernetes escapes
	// (k8s.io/apiserver/pkg/cel/escaping.go), so it is accessed as is.
	if r := "has(self.address) != has(self.interface)"; !hasRule(*peer, r) {
		t.Errorf("peer rules %+v lack %q", peer.Validations, r)
	}
	if !hasRule(peer.Properties["address"], "isIP(self)") || !hasRule(peer.Properties["localAddress"], "isIP(self)") {
		t.Error("address/localAddress lack isIP(self)")
	}
	if !hasRule(spec.Properties["pools"].Items.Properties["cidr"], "isCIDR(self)") {
		t.Error("pools[].cidr lacks isCIDR(self)")
	}
	for _, s := range []schema{spec.Properties["asn"], peer.Properties["asn"]} {
		if s.Minimum == nil || *s.Minimum != 1 || s.Maximum == nil || *s.Maximum != 4294967294 || s.Format == "int32" {
			t.Errorf("asn schema %+v, want 1..4294967294 and not int32", s)
		}
	}
	if f := spec.Properties["routerID"].Format; f != "ipv4" {
		t.Errorf("routerID format %q, want ipv4", f)
	}
	if e := peer.Properties["families"].Items.Enum; !reflect.DeepEqual(e, []any{"ipv4", "ipv6"}) {
		t.Errorf("families enum %v", e)
	}
	if e := spec.Properties["bgp"].Properties["importPolicy"].Enum; !reflect.DeepEqual(e, []any{"reject", "accept"}) {
		t.Errorf("importPolicy enum %v", e)
	}
	if p := spec.Properties["defaults"].Properties["ipAlgo"].Pattern; p == "" {
		t.Error("defaults.ipAlgo has no pattern")
	}
	for _, f := range []string{"asn", "routerID", "pools"} {
		if !slices.Contains(spec.Required, f) {
			t.Errorf("spec.%s not required (required: %v)", f, spec.Required)
		}
	}
	if !hasRule(spec.Properties["routerID"], "isIP(self) && ip(self).family() == 4") {
		t.Errorf("routerID rules %+v lack the IPv4 check", spec.Properties["routerID"].Validations)
	}

	// Ranges: what nodeconfig.Validate refuses, the API server refuses,
	// and no number is out of its Go type's range (the converter would
	// wrap it).
	timers := peer.Properties["timers"]
	bfd := peer.Properties["bfd"]
	gr := peer.Properties["gracefulRestart"]
	for _, tc := range []struct {
		path    string
		s       schema
		min, mx float64
	}{
		{"timers.holdTime", timers.Properties["holdTime"], 0, 65535},
		{"timers.keepaliveTime", timers.Properties["keepaliveTime"], 0, 65535},
		{"timers.connectRetry", timers.Properties["connectRetry"], 0, 4294967295},
		{"gracefulRestart.restartTime", gr.Properties["restartTime"], 0, 4095},
		{"gracefulRestart.deferralTime", gr.Properties["deferralTime"], 0, 4294967295},
		{"bfd.intervalMs", bfd.Properties["intervalMs"], 0, 4294967295},
		{"bfd.multiplier", bfd.Properties["multiplier"], 0, 4294967295},
		{"ttlSecurityMin", peer.Properties["ttlSecurityMin"], 0, 255},
		{"ebgpMultihop", peer.Properties["ebgpMultihop"], 0, 255},
		{"maxPrefixes", peer.Properties["maxPrefixes"], 0, 4294967295},
		{"port", peer.Properties["port"], 0, 65535},
	} {
		if tc.s.Minimum == nil || *tc.s.Minimum != tc.min || tc.s.Maximum == nil || *tc.s.Maximum != tc.mx {
			t.Errorf("peer %s: range %v..%v, want %v..%v", tc.path, tc.s.Minimum, tc.s.Maximum, tc.min, tc.mx)
		}
	}
	if !hasRule(timers.Properties["holdTime"], "self == 0 || self >= 3") {
		t.Error("timers.holdTime lacks 0 or >= 3")
	}
	// Rules on an object that are about one field name it (fieldPath), so
	// the API server's error does too.
	for _, tc := range []struct {
		what      string
		s         schema
		fieldPath string
		contains  string
	}{
		{"timers", timers, ".keepaliveTime", "self.keepaliveTime < "},
		{"bfd", bfd, ".intervalMs", "self.intervalMs >= 10 && self.intervalMs <= 60000"},
		{"bfd", bfd, ".multiplier", "self.multiplier <= 255"},
		{"peer", *peer, ".localAddress", "ip(self.address).family() == ip(self.localAddress).family()"},
		{"peer", *peer, ".ttlSecurityMin", "self.ttlSecurityMin == 0"},
		{"peer", *peer, ".families", "f == 'ipv6'"},
	} {
		found := false
		for _, v := range tc.s.Validations {
			if strings.Contains(v.Rule, tc.contains) {
				found = true
				if v.FieldPath != tc.fieldPath {
					t.Errorf("%s rule %q: fieldPath %q, want %q", tc.what, v.Rule, v.FieldPath, tc.fieldPath)
				}
			}
		}
		if !found {
			t.Errorf("%s: no rule with %q (rules %+v)", tc.what, tc.contains, tc.s.Validations)
		}
	}
	// The BFD ranges hold while BFD is enabled, as nodeconfig.Validate
	// checks them.
	for _, v := range bfd.Validations {
		if !strings.HasPrefix(v.Rule, "!has(self.enabled) || !self.enabled || ") {
			t.Errorf("bfd rule %q applies with BFD disabled", v.Rule)
		}
	}
}

// TestCRDMatchesTypes catches a field added to the Go types without `make
// generate`: every JSON field of NodeConfig must be in the CRD schema and
// vice versa.
func TestCRDMatchesTypes(t *testing.T) {
	for _, tc := range []struct {
		path string
		obj  any
		tops []string
	}{
		{crdPath, v1alpha1.NodeConfig{}, []string{"spec", "status"}},
		{poolCRDPath, v1alpha1.AddressPool{}, []string{"spec", "status"}},
		{claimCRDPath, v1alpha1.AddressClaim{}, []string{"spec"}},
	} {
		root := loadCRD(t, tc.path).Spec.Versions[0].Schema.OpenAPIV3Schema
		for _, top := range tc.tops {
			f, _ := reflect.TypeOf(tc.obj).FieldByName(strings.ToUpper(top[:1]) + top[1:])
			compareFields(t, reflect.TypeOf(tc.obj).Name()+"."+top, f.Type, root.Properties[top])
		}
	}
}

var skipTypes = map[reflect.Type]bool{
	reflect.TypeOf(metav1.Time{}):      true,
	reflect.TypeOf(metav1.Condition{}): true,
}

func compareFields(t *testing.T, path string, typ reflect.Type, s schema) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if skipTypes[typ] {
		return
	}
	switch typ.Kind() {
	case reflect.Slice:
		if s.Items == nil {
			t.Errorf("%s: Go slice, schema %q without items", path, s.Type)
			return
		}
		compareFields(t, path+"[]", typ.Elem(), *s.Items)
		return
	case reflect.Struct:
	default:
		return
	}
	seen := map[string]bool{}
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		seen[name] = true
		sub, ok := s.Properties[name]
		if !ok {
			t.Errorf("%s.%s: in the Go type, not in the CRD (run make generate)", path, name)
			continue
		}
		compareFields(t, path+"."+name, f.Type, sub)
	}
	for name := range s.Properties {
		if !seen[name] {
			t.Errorf("%s.%s: in the CRD, not in the Go type (run make generate)", path, name)
		}
	}
}

func TestScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{&v1alpha1.NodeConfig{}, &v1alpha1.NodeConfigList{},
		&v1alpha1.AddressPool{}, &v1alpha1.AddressPoolList{}, &v1alpha1.AddressClaim{}, &v1alpha1.AddressClaimList{}} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil {
			t.Fatal(err)
		}
		if gvks[0].GroupVersion() != v1alpha1.GroupVersion {
			t.Errorf("%T registered as %v", obj, gvks[0])
		}
	}
	if gv := v1alpha1.GroupVersion.String(); gv != "flock.fritzlab.net/v1alpha1" {
		t.Errorf("GroupVersion = %s", gv)
	}
	if r := v1alpha1.Resource("nodeconfigs"); r.Group != "flock.fritzlab.net" || r.Resource != "nodeconfigs" {
		t.Errorf("Resource = %v", r)
	}
}

func TestDeepCopy(t *testing.T) {
	yes := true
	since := metav1.Now()
	nc := &v1alpha1.NodeConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec: v1alpha1.NodeConfigSpec{
			ASN: 64512, RouterID: "192.0.2.1",
			Pools:    []v1alpha1.Pool{{CIDR: "fd00::/64", Namespaces: []string{"a"}}},
			Defaults: v1alpha1.Defaults{IPv6: &yes},
			BGP: v1alpha1.BGP{Peers: []v1alpha1.Peer{{
				Address: "fd00::2", ASN: 64513, Families: []string{"ipv6"},
				Communities: v1alpha1.KindCommunities{Summary: []string{"1:2"}},
			}}},
		},
		Status: v1alpha1.NodeConfigStatus{
			Peers:      "1/1",
			PeerStates: []v1alpha1.PeerStatus{{Peer: "fd00::2", State: "established", Since: &since}},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue}},
		},
	}
	cp := nc.DeepCopyObject().(*v1alpha1.NodeConfig)
	if !reflect.DeepEqual(nc, cp) {
		t.Fatalf("copy differs:\n%+v\n%+v", nc, cp)
	}
	cp.Spec.Pools[0].Namespaces[0] = "b"
	*cp.Spec.Defaults.IPv6 = false
	cp.Spec.BGP.Peers[0].Communities.Summary[0] = "3:4"
	cp.Status.PeerStates[0].Since.Time = cp.Status.PeerStates[0].Since.Add(1)
	if nc.Spec.Pools[0].Namespaces[0] != "a" || !*nc.Spec.Defaults.IPv6 ||
		nc.Spec.BGP.Peers[0].Communities.Summary[0] != "1:2" || !nc.Status.PeerStates[0].Since.Equal(&since) {
		t.Error("the copy shares memory with the original")
	}
	list := &v1alpha1.NodeConfigList{Items: []v1alpha1.NodeConfig{*nc}}
	if !reflect.DeepEqual(list, list.DeepCopyObject()) {
		t.Error("list copy differs")
	}
}

func TestAddressPoolDeepCopy(t *testing.T) {
	ap := &v1alpha1.AddressPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Spec: v1alpha1.AddressPoolSpec{
			CIDRs: []string{"2001:db8:100::/112"}, Use: []string{v1alpha1.UsePod}, Namespaces: []string{"prod"},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "edge"}},
		},
		Status: v1alpha1.AddressPoolStatus{Claims: 2, Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonInvalidSpec, Message: "spec.cidrs[0]: bad"}}},
	}
	cp := ap.DeepCopyObject().(*v1alpha1.AddressPool)
	if !reflect.DeepEqual(ap, cp) {
		t.Fatalf("copy differs:\n%+v\n%+v", ap, cp)
	}
	cp.Spec.CIDRs[0], cp.Spec.Use[0], cp.Spec.Namespaces[0] = "x", "y", "z"
	cp.Spec.NamespaceSelector.MatchLabels["tier"] = "core"
	cp.Status.Conditions[0].Status = metav1.ConditionTrue
	if ap.Spec.CIDRs[0] != "2001:db8:100::/112" || ap.Spec.Use[0] != v1alpha1.UsePod || ap.Spec.Namespaces[0] != "prod" ||
		ap.Spec.NamespaceSelector.MatchLabels["tier"] != "edge" || ap.Status.Conditions[0].Status != metav1.ConditionFalse {
		t.Error("the copy shares memory with the original")
	}
	claim := &v1alpha1.AddressClaim{ObjectMeta: metav1.ObjectMeta{Name: "ip-x"}, Spec: v1alpha1.AddressClaimSpec{
		IP: "2001:db8:100::1", Use: v1alpha1.UsePod, Pool: "pods", Node: "node-a", ContainerID: "c1",
		Pod: &v1alpha1.ClaimPod{Namespace: "prod", Name: "web-0", UID: "u1"},
	}}
	lb := &v1alpha1.AddressClaim{ObjectMeta: metav1.ObjectMeta{Name: "ip-y"}, Spec: v1alpha1.AddressClaimSpec{
		IP: "2001:db8:200::1", Use: v1alpha1.UseLoadBalancer, Pool: "lb",
		Service: &v1alpha1.ClaimService{Namespace: "prod", Name: "web", UID: "u2"},
	}}
	for _, obj := range []runtime.Object{claim, lb, &v1alpha1.AddressPoolList{Items: []v1alpha1.AddressPool{*ap}},
		&v1alpha1.AddressClaimList{Items: []v1alpha1.AddressClaim{*claim, *lb}}} {
		if !reflect.DeepEqual(obj, obj.DeepCopyObject()) {
			t.Errorf("%T copy differs", obj)
		}
	}
	cc, lc := claim.DeepCopy(), lb.DeepCopy()
	cc.Spec.Pod.Name, lc.Spec.Service.Name = "other", "other"
	if claim.Spec.Pod.Name != "web-0" || lb.Spec.Service.Name != "web" {
		t.Error("the claim's copy shares its holder with the original")
	}
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of flock's custom resources.
const GroupName = "flock.fritzlab.net"

// GroupVersion is the group and version of the types in this package.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// SchemeGroupVersion is GroupVersion under the name client-go's generators
// and helpers expect.
var SchemeGroupVersion = GroupVersion

var (
	// SchemeBuilder registers this package's types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns a GroupResource of this group, e.g. Resource("nodeconfigs").
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &NodeConfig{}, &NodeConfigList{},
		&AddressPool{}, &AddressPoolList{}, &AddressClaim{}, &AddressClaimList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

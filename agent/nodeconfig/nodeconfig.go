// Package nodeconfig loads and validates a NodeConfig spec: from the
// standalone YAML file here, from the API server in Kubernetes mode. Both
// paths share Validate, so a bad value gets the same error either way.
package nodeconfig

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"code.fritzlab.net/fritzlab/flock/ipam"
	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// APIVersion and Kind expected at the top of a node-config file.
const (
	APIVersion = "flock.fritzlab.net/v1alpha1"
	Kind       = "NodeConfig"
)

// File is the standalone node-config file: a NodeConfig object whose spec is
// the CRD's spec type.
type File struct {
	APIVersion string                  `json:"apiVersion"`
	Kind       string                  `json:"kind"`
	Metadata   Metadata                `json:"metadata"`
	Spec       v1alpha1.NodeConfigSpec `json:"spec"`
	// Raw is the file's content as read by Load (the reload baseline).
	Raw []byte `json:"-"`
}

// Metadata is the subset of object metadata the file uses.
type Metadata struct {
	Name string `json:"name"`
}

// Load reads, parses and validates a node-config file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("node config %s: %w", path, err)
	}
	f.Raw = data
	return f, nil
}

// Parse parses and validates node-config YAML. Unknown fields are errors: a
// misspelt knob must not be silently ignored.
func Parse(data []byte) (*File, error) {
	var f File
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, err
	}
	if f.APIVersion != APIVersion {
		return nil, fmt.Errorf("apiVersion: %q, want %q", f.APIVersion, APIVersion)
	}
	if f.Kind != Kind {
		return nil, fmt.Errorf("kind: %q, want %q", f.Kind, Kind)
	}
	if err := Validate(&f.Spec); err != nil {
		return nil, err
	}
	return &f, nil
}

// Validate checks a spec and names the offending field and value.
func Validate(s *v1alpha1.NodeConfigSpec) error {
	var errs []error
	if s.ASN == 0 || s.ASN == 4294967295 {
		errs = append(errs, fmt.Errorf("spec.asn: %d is not a usable AS number (1..4294967294)", s.ASN))
	}
	if rid, err := netip.ParseAddr(s.RouterID); err != nil || !rid.Is4() {
		errs = append(errs, fmt.Errorf("spec.routerID: %q is not an IPv4 dotted quad", s.RouterID))
	}
	if len(s.Pools) == 0 {
		errs = append(errs, errors.New("spec.pools: at least one pool is required"))
	}
	if _, err := Pools(s); err != nil {
		errs = append(errs, err)
	}
	have := map[bool]bool{} // is4 → a non-shared pool of that family exists
	for _, p := range s.Pools {
		if pfx, err := netip.ParsePrefix(p.CIDR); err == nil && !p.Shared {
			have[pfx.Addr().Is4()] = true
		}
	}
	if s.Defaults.WantIPv6() && !have[false] {
		errs = append(errs, errors.New("spec.defaults.ipv6: pods get IPv6 by default, but no pool is a (non-shared) IPv6 node summary; add one or set ipv6: false"))
	}
	if s.Defaults.IPv4 && !have[true] {
		errs = append(errs, errors.New("spec.defaults.ipv4: true, but no pool is a (non-shared) IPv4 node summary; add one or set ipv4: false"))
	}
	errs = append(errs, validateBGP(&s.BGP)...)
	if s.Defaults.IPAlgo != "" {
		if _, err := ipam.ParseAlgo(s.Defaults.IPAlgo); err != nil {
			errs = append(errs, fmt.Errorf("spec.defaults.ipAlgo: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Pools converts the spec's pools to IPAM pools.
func Pools(s *v1alpha1.NodeConfigSpec) ([]ipam.Pool, error) {
	var errs []error
	var out []ipam.Pool
	for i, p := range s.Pools {
		field := fmt.Sprintf("spec.pools[%d].cidr", i)
		pfx, err := netip.ParsePrefix(p.CIDR)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a CIDR", field, p.CIDR))
			continue
		}
		if pfx.Masked() != pfx {
			errs = append(errs, fmt.Errorf("%s: %q has host bits set (did you mean %s?)", field, p.CIDR, pfx.Masked()))
			continue
		}
		for j, prev := range out {
			if prev.Prefix.Overlaps(pfx) {
				errs = append(errs, fmt.Errorf("%s: %s overlaps spec.pools[%d] %s", field, pfx, j, prev.Prefix))
			}
		}
		for j, ns := range p.Namespaces {
			if strings.TrimSpace(ns) != "" && strings.TrimSpace(ns) != ns {
				errs = append(errs, fmt.Errorf("spec.pools[%d].namespaces[%d]: %q has surrounding spaces", i, j, ns))
				continue
			}
			if strings.TrimSpace(ns) == "" {
				errs = append(errs, fmt.Errorf("spec.pools[%d].namespaces[%d]: %q: empty namespace", i, j, ns))
			}
		}
		out = append(out, ipam.Pool{Prefix: pfx, Summary: !p.Shared, Namespaces: p.Namespaces})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if _, err := ipam.New(out); err != nil {
		return nil, fmt.Errorf("spec.pools: %w", err)
	}
	return out, nil
}

// Summaries returns the node summary prefixes (non-shared pools).
func Summaries(s *v1alpha1.NodeConfigSpec) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s.Pools {
		if pfx, err := netip.ParsePrefix(p.CIDR); err == nil && !p.Shared {
			out = append(out, pfx)
		}
	}
	return out
}

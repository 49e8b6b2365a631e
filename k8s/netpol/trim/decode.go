package trim

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DecodePod decodes b, a k8s.io.api.core.v1.Pod protobuf message (what
// (*corev1.Pod).Unmarshal reads), into what NewPod keeps of it. Every pod
// change of the cluster is decoded; a corev1.Pod made only to be trimmed
// (its decoding, its trimming and its garbage) was most of what
// flock-policy spent on one. What it reads is read as the generated
// Unmarshal reads it (a field given twice: the last string, the merged
// map and messages, the appended list); what NewPod drops is skipped
// unread. The result is NewPod's: TestDecodePodIsNewPod holds them to it.
func DecodePod(b []byte) (*Pod, error) {
	d := decoders.Get().(*podDecoder)
	defer d.release()
	if err := d.message(b, d.podField); err != nil {
		return nil, fmt.Errorf("trim: decode pod: %w", err)
	}
	return d.build(), nil
}

// podDecoder holds what is read of a pod while it is decoded: views of
// b (strings that share its bytes), copied into the Pod built, never
// kept. It is reused: a decoded pod allocates only what it keeps.
type podDecoder struct {
	name, namespace, uid, rv, nodeName, phase string
	hostNetwork                               bool
	labels                                    map[string]string
	annotations                               map[string]string // the kept ones
	containers                                []corev1.Container
	ips                                       []string
}

var decoders = sync.Pool{New: func() any {
	return &podDecoder{labels: map[string]string{}, annotations: map[string]string{}}
}}

func (d *podDecoder) release() {
	labels, annotations := d.labels, d.annotations
	clear(labels)
	clear(annotations)
	for i := range d.containers {
		d.containers[i] = corev1.Container{Ports: d.containers[i].Ports[:0]}
	}
	*d = podDecoder{labels: labels, annotations: annotations, containers: d.containers[:0], ips: d.ips[:0]}
	decoders.Put(d)
}

var errWireType = errors.New("wrong wire type")

// message calls field for each field of the message b; fields it does
// not read (it returns n < 0) are skipped.
func (d *podDecoder) message(b []byte, field func(protowire.Number, protowire.Type, []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		m, err := field(num, typ, b)
		if err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
		if m < 0 {
			if m = protowire.ConsumeFieldValue(num, typ, b); m < 0 {
				return fmt.Errorf("field %d: %w", num, protowire.ParseError(m))
			}
		}
		b = b[m:]
	}
	return nil
}

// bytesField is a length-delimited field's value and its length.
func bytesField(typ protowire.Type, b []byte) ([]byte, int, error) {
	if typ != protowire.BytesType {
		return nil, 0, errWireType
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return nil, 0, protowire.ParseError(n)
	}
	return v, n, nil
}

func varintField(typ protowire.Type, b []byte) (uint64, int, error) {
	if typ != protowire.VarintType {
		return 0, 0, errWireType
	}
	v, n := protowire.ConsumeVarint(b)
	if n < 0 {
		return 0, 0, protowire.ParseError(n)
	}
	return v, n, nil
}

// view is b as a string sharing its bytes: valid while b is.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// stringField reads a string field into *s (a view).
func stringField(s *string, typ protowire.Type, b []byte) (int, error) {
	v, n, err := bytesField(typ, b)
	*s = view(v)
	return n, err
}

// sub decodes a field that is a message with field.
func (d *podDecoder) sub(typ protowire.Type, b []byte, field func(protowire.Number, protowire.Type, []byte) (int, error)) (int, error) {
	v, n, err := bytesField(typ, b)
	if err != nil {
		return 0, err
	}
	return n, d.message(v, field)
}

// Pod: metadata 1, spec 2, status 3.
func (d *podDecoder) podField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	switch num {
	case 1:
		return d.sub(typ, b, d.metaField)
	case 2:
		return d.sub(typ, b, d.specField)
	case 3:
		return d.sub(typ, b, d.statusField)
	}
	return -1, nil
}

// ObjectMeta: name 1, namespace 3, uid 5, resourceVersion 6, labels 11,
// annotations 12.
func (d *podDecoder) metaField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	switch num {
	case 1:
		return stringField(&d.name, typ, b)
	case 3:
		return stringField(&d.namespace, typ, b)
	case 5:
		return stringField(&d.uid, typ, b)
	case 6:
		return stringField(&d.rv, typ, b)
	case 11, 12:
		v, n, err := bytesField(typ, b)
		if err != nil {
			return 0, err
		}
		k, val, err := d.mapEntry(v)
		if err != nil {
			return 0, err
		}
		if num == 11 {
			d.labels[k] = val
		} else if kept, ok := keptAnnotation(k); ok {
			d.annotations[kept] = val
		}
		return n, nil
	}
	return -1, nil
}

// keptAnnotation is k as keptAnnotations holds it, if it is one.
func keptAnnotation(k string) (string, bool) {
	for _, a := range keptAnnotations {
		if a == k {
			return a, true
		}
	}
	return "", false
}

// mapEntry is a map<string, string> entry: key 1, value 2 (either may be
// absent: "").
func (d *podDecoder) mapEntry(b []byte) (k, v string, err error) {
	err = d.message(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch num {
		case 1:
			return stringField(&k, typ, b)
		case 2:
			return stringField(&v, typ, b)
		}
		return -1, nil
	})
	return k, v, err
}

// PodSpec: containers 2, nodeName 10, hostNetwork 11.
func (d *podDecoder) specField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	switch num {
	case 2:
		if cap(d.containers) > len(d.containers) {
			d.containers = d.containers[:len(d.containers)+1]
		} else {
			d.containers = append(d.containers, corev1.Container{})
		}
		return d.sub(typ, b, d.containerField)
	case 10:
		return stringField(&d.nodeName, typ, b)
	case 11:
		v, n, err := varintField(typ, b)
		d.hostNetwork = v != 0
		return n, err
	}
	return -1, nil
}

// Container: name 1, ports 6.
func (d *podDecoder) containerField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	c := &d.containers[len(d.containers)-1]
	switch num {
	case 1:
		return stringField(&c.Name, typ, b)
	case 6:
		c.Ports = append(c.Ports, corev1.ContainerPort{})
		p := &c.Ports[len(c.Ports)-1]
		return d.sub(typ, b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
			// ContainerPort: name 1, containerPort 3, protocol 4.
			switch num {
			case 1:
				return stringField(&p.Name, typ, b)
			case 3:
				v, n, err := varintField(typ, b)
				p.ContainerPort = int32(v)
				return n, err
			case 4:
				var s string
				n, err := stringField(&s, typ, b)
				p.Protocol = corev1.Protocol(s)
				return n, err
			}
			return -1, nil
		})
	}
	return -1, nil
}

// PodStatus: phase 1, podIPs 12 (PodIP: ip 1).
func (d *podDecoder) statusField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	switch num {
	case 1:
		return stringField(&d.phase, typ, b)
	case 12:
		var ip string
		n, err := d.sub(typ, b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
			if num == 1 {
				return stringField(&ip, typ, b)
			}
			return -1, nil
		})
		d.ips = append(d.ips, ip)
		return n, err
	}
	return -1, nil
}

// phases are the phases a pod has: one copy of each.
var phases = map[string]corev1.PodPhase{}

func init() {
	for _, p := range []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown} {
		phases[string(p)] = p
	}
}

// build is the Pod of what was read, its strings copied out of the
// buffer: as NewPod makes it, and sharing what NewPod shares.
func (d *podDecoder) build() *Pod {
	out := &Pod{}
	// One allocation for the strings of the pod's own.
	own := string(append(append(append(make([]byte, 0, len(d.name)+len(d.uid)+len(d.rv)), d.name...), d.uid...), d.rv...))
	out.Name, out.UID, out.ResourceVersion = own[:len(d.name)], types.UID(own[len(d.name):len(d.name)+len(d.uid)]), own[len(d.name)+len(d.uid):]
	out.Namespace = name(d.namespace)
	out.Labels = sharedLabels(d.labels, true)
	if len(d.annotations) > 0 {
		out.Annotations = make(map[string]string, len(d.annotations))
		for k, v := range d.annotations {
			out.Annotations[k] = string([]byte(v))
		}
	}
	out.Spec.NodeName = name(d.nodeName)
	out.Spec.HostNetwork = d.hostNetwork
	out.Spec.Containers = containers(d.containers)
	if p, ok := phases[d.phase]; ok {
		out.Status.Phase = p
	} else {
		out.Status.Phase = corev1.PodPhase(string([]byte(d.phase)))
	}
	if len(d.ips) > 0 {
		n := 0
		for _, ip := range d.ips {
			n += len(ip)
		}
		all := make([]byte, 0, n)
		for _, ip := range d.ips {
			all = append(all, ip...)
		}
		s := string(all)
		out.Status.PodIPs = make([]corev1.PodIP, len(d.ips))
		for i, ip := range d.ips {
			out.Status.PodIPs[i].IP, s = s[:len(ip)], s[len(ip):]
		}
	}
	return out
}

package relay

import (
	"bytes"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// The relay speaks what the API server speaks to client-go's typed
// clients (protobuf, watch events length-delimited), so that an informer
// reads it as it reads the API server.
var (
	protobuf  runtime.SerializerInfo
	podCodec  runtime.Encoder // a Pod or PodList, with its type
	eventEnc  runtime.Encoder // a metav1.WatchEvent, raw
	mediaType = runtime.ContentTypeProtobuf
)

func init() {
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok || info.StreamSerializer == nil {
		panic("relay: client-go's scheme has no protobuf stream serializer")
	}
	protobuf = info
	podCodec = scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
	eventEnc = scheme.Codecs.EncoderForVersion(info.StreamSerializer.Serializer, corev1.SchemeGroupVersion)
}

// encodePod is p as a watch event's or a list's item carries it.
func encodePod(p *corev1.Pod) ([]byte, error) {
	var b bytes.Buffer
	if err := podCodec.Encode(p, &b); err != nil {
		return nil, fmt.Errorf("relay: encode pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return b.Bytes(), nil
}

// frame is a watch event of the encoded object obj, framed for the
// stream: what is written to every watcher as it is.
func frame(t watch.EventType, obj []byte) ([]byte, error) {
	var ev bytes.Buffer
	if err := eventEnc.Encode(&metav1.WatchEvent{Type: string(t), Object: runtime.RawExtension{Raw: obj}}, &ev); err != nil {
		return nil, fmt.Errorf("relay: encode %s event: %w", t, err)
	}
	var out bytes.Buffer
	if _, err := protobuf.StreamSerializer.Framer.NewFrameWriter(&out).Write(ev.Bytes()); err != nil {
		return nil, fmt.Errorf("relay: frame %s event: %w", t, err)
	}
	return out.Bytes(), nil
}

// bookmark is a BOOKMARK event at rv; end marks the end of the initial
// events of a watch that asked for them (sendInitialEvents).
func bookmark(rv uint64, end bool) ([]byte, error) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: formatRV(rv)}}
	if end {
		p.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	obj, err := encodePod(p)
	if err != nil {
		return nil, err
	}
	return frame(watch.Bookmark, obj)
}

// statusFrame is an ERROR event carrying st, as the API server ends a
// watch it cannot serve (410 Gone: relist).
func statusFrame(st *metav1.Status) ([]byte, error) {
	var b bytes.Buffer
	if err := podCodec.Encode(st, &b); err != nil {
		return nil, fmt.Errorf("relay: encode status: %w", err)
	}
	return frame(watch.Error, b.Bytes())
}

// trimming is client-go's codecs for the typed clients, but for the pods
// of watch events, which are decoded straight into *trim.Pod (the form
// flock-policy caches them in): every pod change of the cluster reaches
// every node, and a corev1.Pod made only to be trimmed was most of what
// one cost a node. Lists and everything else decode as before.
var trimming runtime.NegotiatedSerializer = trimmingSerializer{rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion()}

type trimmingSerializer struct{ runtime.NegotiatedSerializer }

func (t trimmingSerializer) DecoderToVersion(d runtime.Decoder, gv runtime.GroupVersioner) runtime.Decoder {
	return trimmingDecoder{t.NegotiatedSerializer.DecoderToVersion(d, gv)}
}

// trimmingDecoder decodes a v1 Pod in protobuf, asked for without an
// object to decode into (a watch event's object), as a *trim.Pod; any
// other object as its Decoder does.
type trimmingDecoder struct{ runtime.Decoder }

var podGVK = corev1.SchemeGroupVersion.WithKind("Pod")

func (t trimmingDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into == nil {
		if raw, ok := podMessage(data); ok {
			p, err := trim.DecodePod(raw)
			if err != nil {
				return nil, nil, fmt.Errorf("relay: %w", err)
			}
			return p, &podGVK, nil
		}
	}
	return t.Decoder.Decode(data, defaults, into)
}

// protobufMagic starts what the protobuf serializer encodes (then a
// runtime.Unknown: typeMeta 1 {apiVersion 1, kind 2}, raw 2,
// contentEncoding 3).
var protobufMagic = []byte("k8s\x00")

// podMessage is the Pod message data holds, if data is a v1 Pod as the
// protobuf serializer encodes one.
func podMessage(data []byte) ([]byte, bool) {
	b, ok := bytes.CutPrefix(data, protobufMagic)
	if !ok {
		return nil, false
	}
	var apiVersion, kind, raw, encoding []byte
	ok = bytesFields(b, func(num protowire.Number, v []byte) bool {
		switch num {
		case 1:
			return bytesFields(v, func(num protowire.Number, s []byte) bool {
				switch num {
				case 1:
					apiVersion = s
				case 2:
					kind = s
				}
				return true
			})
		case 2:
			raw = v
		case 3:
			encoding = v
		}
		return true
	})
	return raw, ok && string(apiVersion) == "v1" && string(kind) == "Pod" && len(encoding) == 0
}

// bytesFields calls f with each field of the message b, all of which
// must be length-delimited (runtime.Unknown's and TypeMeta's are): false
// if one is not, b is malformed, or f says so.
func bytesFields(b []byte, f func(protowire.Number, []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 || !f(num, v) {
			return false
		}
		b = b[n+m:]
	}
	return true
}

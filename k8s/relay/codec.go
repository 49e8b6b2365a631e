package relay

import (
	"bytes"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
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

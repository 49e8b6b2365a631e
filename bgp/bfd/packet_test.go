package bfd

import (
	"errors"
	"testing"
	"time"
)

func TestPacketRoundTrip(t *testing.T) {
	for _, p := range []Packet{
		{State: Down, DetectMult: 3, MyDiscr: 1, DesiredMinTx: time.Second, RequiredMinRx: 300 * time.Millisecond},
		{Diag: DiagDetectExpired, State: Init, Poll: true, DetectMult: 5, MyDiscr: 0xdeadbeef, YourDiscr: 7, DesiredMinTx: 50 * time.Millisecond, RequiredMinRx: 50 * time.Millisecond},
		{Diag: DiagAdminDown, State: AdminDown, Final: true, ControlPlaneIndependent: true, DetectMult: 1, MyDiscr: 9, YourDiscr: 0xffffffff, RequiredMinEchoRx: time.Millisecond},
		{State: Up, Demand: true, DetectMult: 255, MyDiscr: 2, YourDiscr: 3},
	} {
		b := p.Marshal()
		if len(b) != 24 {
			t.Fatalf("len = %d", len(b))
		}
		got, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
		if got != p {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, p)
		}
	}
}

// The wire layout, byte by byte, against RFC 5880 §4.1 (a packet FRR's
// bfdd sends when its session is Down and knows no remote).
func TestPacketWireLayout(t *testing.T) {
	b := Packet{State: Down, DetectMult: 3, MyDiscr: 0x01020304, DesiredMinTx: time.Second, RequiredMinRx: time.Second, Diag: DiagNeighborDown}.Marshal()
	want := []byte{0x23, 0x40, 3, 24, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0x0f, 0x42, 0x40, 0, 0x0f, 0x42, 0x40, 0, 0, 0, 0}
	if string(b) != string(want) {
		t.Fatalf("wire:\n got % x\nwant % x", b, want)
	}
}

func TestUnmarshalRejects(t *testing.T) {
	good := Packet{State: Up, DetectMult: 3, MyDiscr: 1, YourDiscr: 2}.Marshal()
	mod := func(f func(b []byte) []byte) []byte {
		b := append([]byte(nil), good...)
		return f(b)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", good[:23], ErrShort},
		{"version 0", mod(func(b []byte) []byte { b[0] &^= 0xe0; return b }), ErrVersion},
		{"version 2", mod(func(b []byte) []byte { b[0] = b[0]&0x1f | 2<<5; return b }), ErrVersion},
		{"length below 24", mod(func(b []byte) []byte { b[3] = 23; return b }), ErrLength},
		{"length beyond payload", mod(func(b []byte) []byte { b[3] = 26; return b }), ErrLength},
		{"auth bit", mod(func(b []byte) []byte { b[1] |= flagAuth; return b }), ErrAuth},
		{"detect mult 0", mod(func(b []byte) []byte { b[2] = 0; return b }), ErrDetectMult},
		{"multipoint", mod(func(b []byte) []byte { b[1] |= flagMultipoint; return b }), ErrMultipoint},
		{"my discriminator 0", mod(func(b []byte) []byte { copy(b[4:8], []byte{0, 0, 0, 0}); return b }), ErrMyDiscr},
	} {
		if _, err := Unmarshal(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	// A longer datagram whose length field says 24 is fine (trailing bytes ignored).
	if _, err := Unmarshal(append(append([]byte(nil), good...), 0, 0)); err != nil {
		t.Errorf("trailing bytes: %v", err)
	}
}

func FuzzUnmarshal(f *testing.F) {
	f.Add(Packet{State: Up, DetectMult: 3, MyDiscr: 1, YourDiscr: 2}.Marshal())
	f.Add(Packet{State: Down, Poll: true, DetectMult: 3, MyDiscr: 5}.Marshal())
	f.Add([]byte{0x20})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Unmarshal(b)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to the same fields.
		q, err := Unmarshal(p.Marshal())
		if err != nil || q != p {
			t.Fatalf("re-encode: %+v vs %+v (%v)", q, p, err)
		}
	})
}

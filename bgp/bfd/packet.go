// Package bfd is flock's single-hop BFD (RFC 5880, RFC 5881): asynchronous
// mode, no echo, no authentication. It replaces GoBGP v4.8.0's BFD, which
// never comes up against FRR's bfdd once the ToR re-creates its session
// (it discards a Down whose discriminator changed) and then resets the BGP
// session every detection time. The speaker drives it: a session per BGP
// peer with BFD enabled, whose Up→Down transition resets that peer.
package bfd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// State of a session (RFC 5880 §4.1).
type State uint8

const (
	AdminDown State = 0
	Down      State = 1
	Init      State = 2
	Up        State = 3
)

func (s State) String() string {
	switch s {
	case AdminDown:
		return "admin-down"
	case Down:
		return "down"
	case Init:
		return "init"
	case Up:
		return "up"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Diag is why a session last left Up (RFC 5880 §4.1).
type Diag uint8

const (
	DiagNone            Diag = 0
	DiagDetectExpired   Diag = 1 // Control Detection Time Expired
	DiagNeighborDown    Diag = 3 // Neighbor Signaled Session Down
	DiagPathDown        Diag = 5
	DiagAdminDown       Diag = 7 // Administratively Down
	diagMax             Diag = 31
	packetLen                = 24
	version                  = 1
	flagPoll                 = 0x20
	flagFinal                = 0x10
	flagControlPlaneInd      = 0x08
	flagAuth                 = 0x04
	flagDemand               = 0x02
	flagMultipoint           = 0x01
)

func (d Diag) String() string {
	switch d {
	case DiagNone:
		return "none"
	case DiagDetectExpired:
		return "detection time expired"
	case 2:
		return "echo failed"
	case DiagNeighborDown:
		return "neighbor signaled down"
	case 4:
		return "forwarding plane reset"
	case DiagPathDown:
		return "path down"
	case 6:
		return "concatenated path down"
	case DiagAdminDown:
		return "administratively down"
	case 8:
		return "reverse concatenated path down"
	}
	return fmt.Sprintf("diag(%d)", uint8(d))
}

// Packet is a BFD Control packet without authentication.
type Packet struct {
	Diag  Diag
	State State
	Poll  bool
	Final bool
	// ControlPlaneIndependent (the C bit): set only by a BFD that survives
	// a control-plane failure. flock's runs in the agent with BGP, so it
	// says no — honestly: a ToR can then treat a BFD loss as a possible
	// control-plane failure and keep graceful-restart routes.
	ControlPlaneIndependent bool
	Demand                  bool
	DetectMult              uint8
	MyDiscr, YourDiscr      uint32
	DesiredMinTx            time.Duration
	RequiredMinRx           time.Duration
	RequiredMinEchoRx       time.Duration
}

// Marshal encodes p (24 bytes).
func (p Packet) Marshal() []byte {
	b := make([]byte, packetLen)
	b[0] = version<<5 | byte(p.Diag&diagMax)
	b[1] = byte(p.State) << 6
	for _, f := range []struct {
		on  bool
		bit byte
	}{{p.Poll, flagPoll}, {p.Final, flagFinal}, {p.ControlPlaneIndependent, flagControlPlaneInd}, {p.Demand, flagDemand}} {
		if f.on {
			b[1] |= f.bit
		}
	}
	b[2] = p.DetectMult
	b[3] = packetLen
	binary.BigEndian.PutUint32(b[4:], p.MyDiscr)
	binary.BigEndian.PutUint32(b[8:], p.YourDiscr)
	binary.BigEndian.PutUint32(b[12:], micros(p.DesiredMinTx))
	binary.BigEndian.PutUint32(b[16:], micros(p.RequiredMinRx))
	binary.BigEndian.PutUint32(b[20:], micros(p.RequiredMinEchoRx))
	return b
}

func micros(d time.Duration) uint32 {
	us := d.Microseconds()
	if us < 0 {
		return 0
	}
	if us > 0xffffffff {
		return 0xffffffff
	}
	return uint32(us)
}

// Errors of Unmarshal: the packet is discarded (RFC 5880 §6.8.6).
var (
	ErrShort      = errors.New("bfd: packet too short")
	ErrVersion    = errors.New("bfd: not version 1")
	ErrLength     = errors.New("bfd: bad length field")
	ErrDetectMult = errors.New("bfd: detect multiplier 0")
	ErrMultipoint = errors.New("bfd: multipoint bit set")
	ErrMyDiscr    = errors.New("bfd: my discriminator 0")
	ErrAuth       = errors.New("bfd: authentication not supported")
)

// Unmarshal decodes and checks a Control packet as RFC 5880 §6.8.6
// requires before a session is even looked up.
func Unmarshal(b []byte) (Packet, error) {
	if len(b) < packetLen {
		return Packet{}, ErrShort
	}
	if b[0]>>5 != version {
		return Packet{}, ErrVersion
	}
	l := int(b[3])
	if l < packetLen || l > len(b) {
		return Packet{}, ErrLength
	}
	if b[1]&flagAuth != 0 {
		return Packet{}, ErrAuth
	}
	p := Packet{
		Diag:                    Diag(b[0] & byte(diagMax)),
		State:                   State(b[1] >> 6),
		Poll:                    b[1]&flagPoll != 0,
		Final:                   b[1]&flagFinal != 0,
		ControlPlaneIndependent: b[1]&flagControlPlaneInd != 0,
		Demand:                  b[1]&flagDemand != 0,
		DetectMult:              b[2],
		MyDiscr:                 binary.BigEndian.Uint32(b[4:]),
		YourDiscr:               binary.BigEndian.Uint32(b[8:]),
		DesiredMinTx:            time.Duration(binary.BigEndian.Uint32(b[12:])) * time.Microsecond,
		RequiredMinRx:           time.Duration(binary.BigEndian.Uint32(b[16:])) * time.Microsecond,
		RequiredMinEchoRx:       time.Duration(binary.BigEndian.Uint32(b[20:])) * time.Microsecond,
	}
	switch {
	case p.DetectMult == 0:
		return Packet{}, ErrDetectMult
	case b[1]&flagMultipoint != 0:
		return Packet{}, ErrMultipoint
	case p.MyDiscr == 0:
		return Packet{}, ErrMyDiscr
	}
	return p, nil
}

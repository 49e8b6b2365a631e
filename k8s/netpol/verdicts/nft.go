package verdicts

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Hook is where the program's base chain sits.
type Hook struct {
	Num      *nftables.ChainHook
	Priority *nftables.ChainPriority
	// Prelude: the engine's rules before its queue (established and
	// related connections, ICMPv6, the node's root processes pass).
	// Tests that send packets from root leave it out.
	Prelude bool
}

// Render queues, on conn, the transaction that replaces table (family
// inet) with p: the kernel never sees a half-written program. The
// caller flushes conn.
func Render(conn *nftables.Conn, table string, hook Hook, p *Program) error {
	r := &renderer{conn: conn, p: p, peerSets: map[*Addrs]string{}, chains: map[string]*nftables.Chain{}, defined: map[string]*nftables.Set{}}
	r.t = &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	conn.AddTable(r.t)
	conn.DelTable(r.t)
	conn.AddTable(r.t)
	for i := range p.Groups {
		r.chains["g"+strconv.Itoa(i)] = conn.AddChain(&nftables.Chain{Name: "g" + strconv.Itoa(i), Table: r.t})
	}
	for i, g := range p.Groups {
		if err := r.group(i, g); err != nil {
			return err
		}
	}
	return r.dispatch(hook)
}

type renderer struct {
	conn     *nftables.Conn
	t        *nftables.Table
	p        *Program
	peerSets map[*Addrs]string
	chains   map[string]*nftables.Chain
	defined  map[string]*nftables.Set
}

func (r *renderer) set(s *nftables.Set, elems []nftables.SetElement) error {
	s.Table = r.t
	if err := r.conn.AddSet(s, elems); err != nil {
		return fmt.Errorf("nftables set %s: %w", s.Name, err)
	}
	return nil
}

func (r *renderer) rule(chain *nftables.Chain, exprs ...expr.Any) {
	r.conn.AddRule(&nftables.Rule{Table: r.t, Chain: chain, Exprs: exprs})
}

var (
	concatPorts  = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	concatPorts4 = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	concatPorts6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService)
)

// Registers (NFT_REG_*): a concatenation's fields sit in consecutive
// 32-bit registers from NFT_REG_1, each padded to 4 bytes.
const (
	reg1    = 1
	reg32_0 = 8
)

func nfproto(v4 bool) []expr.Any {
	p := byte(unix.NFPROTO_IPV6)
	if v4 {
		p = unix.NFPROTO_IPV4
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}
}

// addr loads the packet's source or destination address into reg.
func addr(v4, src bool, reg uint32) *expr.Payload {
	off, n := uint32(24), uint32(16)
	switch {
	case v4 && src:
		off, n = 12, 4
	case v4:
		off, n = 16, 4
	case src:
		off = 8
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

// loadProtoPort loads `meta l4proto . th dport` from 32-bit register at (as
// nft does: the protocol in network order in its 4-byte slot).
func loadProtoPort(at uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: at},
		&expr.Byteorder{SourceRegister: at, DestRegister: at, Op: expr.ByteorderHton, Len: 1, Size: 2},
		&expr.Payload{DestRegister: at + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

func lookup(set *nftables.Set) *expr.Lookup {
	return &expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID}
}

var (
	ret  = &expr.Verdict{Kind: expr.VerdictReturn}
	drop = &expr.Verdict{Kind: expr.VerdictDrop}
)

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func portKey(proto uint8, port uint16) []byte {
	return append(pad4([]byte{proto}), pad4(binaryutil.BigEndian.PutUint16(port))...)
}

// portElems are (proto . port-range) elements of a concatenated interval
// set, prefixed by a's bytes when a is valid.
func portElems(a netip.Addr, ps Ports) []nftables.SetElement {
	var out []nftables.SetElement
	for _, proto := range Protocols {
		for _, pr := range ps.By[proto] {
			var k, e []byte
			if a.IsValid() {
				k, e = pad4(a.AsSlice()), pad4(a.AsSlice())
			}
			out = append(out, nftables.SetElement{Key: append(k, portKey(proto, pr.First)...), KeyEnd: append(e, portKey(proto, pr.Last)...)})
		}
	}
	return out
}

// peerSet is the interval set of the family's addresses in a, named
// once per *Addrs (rules share them); nil if it holds none.
func (r *renderer) peerSet(a *Addrs, v4 bool) (*nftables.Set, error) {
	name, ok := r.peerSets[a]
	if !ok {
		name = "p" + strconv.Itoa(len(r.peerSets))
		r.peerSets[a] = name
	}
	fam, typ := "6", nftables.TypeIP6Addr
	if v4 {
		fam, typ = "4", nftables.TypeIPAddr
	}
	name += "-" + fam
	if s, ok := r.defined[name]; ok {
		return s, nil
	}
	var elems []nftables.SetElement
	for _, rg := range a.Ranges() {
		if rg.From.Is4() != v4 {
			continue
		}
		elems = append(elems, nftables.SetElement{Key: rg.From.AsSlice()})
		if next := rg.To.Next(); next.IsValid() {
			elems = append(elems, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
		}
	}
	if len(elems) == 0 {
		r.defined[name] = nil
		return nil, nil
	}
	s := &nftables.Set{Name: name, KeyType: typ, Interval: true}
	if err := r.set(s, elems); err != nil {
		return nil, err
	}
	r.defined[name] = s
	return s, nil
}

// group renders group i as chain g<i>: return if a term lets the packet
// through, else drop.
func (r *renderer) group(i int, g *Group) error {
	chain := r.chains["g"+strconv.Itoa(i)]
	src := !g.Egress // the peer's address field
	gi := "g" + strconv.Itoa(i)
	for _, v4 := range []bool{true, false} {
		fam, typ, atyp := "6", concatPorts6, nftables.TypeIP6Addr
		if v4 {
			fam, typ, atyp = "4", concatPorts4, nftables.TypeIPAddr
		}
		// Peers several pods hold: their own verdict, alone.
		var all, every, ports []nftables.SetElement
		for _, a := range sortedAddrs(g.Several) {
			if a.Is4() != v4 {
				continue
			}
			every = append(every, nftables.SetElement{Key: a.AsSlice()})
			if g.Several[a].All {
				all = append(all, nftables.SetElement{Key: a.AsSlice()})
				continue
			}
			ports = append(ports, portElems(a, g.Several[a])...)
		}
		if len(all) > 0 {
			s := &nftables.Set{Name: gi + "-sa" + fam, KeyType: atyp}
			if err := r.set(s, all); err != nil {
				return err
			}
			r.rule(chain, append(nfproto(v4), addr(v4, src, reg1), lookup(s), ret)...)
		}
		if len(ports) > 0 {
			s := &nftables.Set{Name: gi + "-sp" + fam, KeyType: typ, Interval: true, Concatenation: true}
			if err := r.set(s, ports); err != nil {
				return err
			}
			r.rule(chain, append(append(nfproto(v4), addr(v4, src, reg1)), append(loadProtoPort(r32(v4)), lookup(s), ret)...)...)
		}
		if len(every) > 0 {
			s := &nftables.Set{Name: gi + "-s" + fam, KeyType: atyp}
			if err := r.set(s, every); err != nil {
				return err
			}
			r.rule(chain, append(nfproto(v4), addr(v4, src, reg1), lookup(s), drop)...)
		}
		for j, t := range g.Terms {
			tj := gi + "-t" + strconv.Itoa(j)
			if t.Named != nil {
				var elems []nftables.SetElement
				for _, pp := range t.Named {
					if pp.Addr.Is4() == v4 {
						elems = append(elems, portElems(pp.Addr, Ports{By: map[uint8][]PortRange{pp.Proto: {{pp.Port, pp.Port}}}})...)
					}
				}
				if len(elems) == 0 {
					continue
				}
				s := &nftables.Set{Name: tj + "-n" + fam, KeyType: typ, Interval: true, Concatenation: true}
				if err := r.set(s, elems); err != nil {
					return err
				}
				r.rule(chain, append(append(nfproto(v4), addr(v4, src, reg1)), append(loadProtoPort(r32(v4)), lookup(s), ret)...)...)
				continue
			}
			var match []expr.Any
			if t.Peers != nil {
				ps, err := r.peerSet(t.Peers, v4)
				if err != nil {
					return err
				}
				if ps == nil {
					continue // no address of this family
				}
				match = append(append(nfproto(v4), addr(v4, src, reg1)), lookup(ps))
			} else if !v4 {
				continue // family-neutral: rendered once, with the IPv4 pass
			}
			if !t.Ports.All {
				name := tj + "-p"
				s, ok := r.defined[name]
				if !ok {
					s = &nftables.Set{Name: name, KeyType: concatPorts, Interval: true, Concatenation: true}
					if err := r.set(s, portElems(netip.Addr{}, t.Ports)); err != nil {
						return err
					}
					r.defined[name] = s
				}
				match = append(match, append(loadProtoPort(reg32_0), lookup(s))...)
			}
			r.rule(chain, append(match, ret)...)
		}
	}
	r.rule(chain, drop)
	return nil
}

// r32 is the 32-bit register after a family's address in a
// concatenation.
func r32(v4 bool) uint32 {
	if v4 {
		return reg32_0 + 1
	}
	return reg32_0 + 4
}

func sortedAddrs[V any](m map[netip.Addr]V) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// dispatch renders the base chain and the maps from addresses to the
// groups that judge them.
func (r *renderer) dispatch(hook Hook) error {
	judge := r.conn.AddChain(&nftables.Chain{Name: "judge", Table: r.t})
	policy := nftables.ChainPolicyAccept
	base := r.conn.AddChain(&nftables.Chain{Name: "verdicts", Table: r.t, Type: nftables.ChainTypeFilter,
		Hooknum: hook.Num, Priority: hook.Priority, Policy: &policy})
	if hook.Prelude {
		r.prelude(base)
	}
	for _, v4 := range []bool{true, false} {
		fam, typ := "6", nftables.TypeIP6Addr
		if v4 {
			fam, typ = "4", nftables.TypeIPAddr
		}
		var judged []nftables.SetElement
		for _, a := range sortedAddrs(r.p.Selected) {
			if a.Is4() == v4 {
				judged = append(judged, nftables.SetElement{Key: a.AsSlice()})
			}
		}
		s := &nftables.Set{Name: "judged" + fam, KeyType: typ}
		if err := r.set(s, judged); err != nil {
			return err
		}
		for _, src := range []bool{true, false} {
			r.rule(base, append(nfproto(v4), addr(v4, src, reg1), lookup(s), &expr.Verdict{Kind: expr.VerdictJump, Chain: judge.Name})...)
		}
		for _, dir := range []struct {
			name string
			src  bool
			by   map[netip.Addr][]int
		}{{"egress", true, r.p.Egress}, {"ingress", false, r.p.Ingress}} {
			var elems []nftables.SetElement
			for _, a := range sortedAddrs(dir.by) {
				if a.Is4() != v4 || len(dir.by[a]) == 0 {
					continue
				}
				elems = append(elems, nftables.SetElement{Key: a.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: r.all(dir.by[a])}})
			}
			m := &nftables.Set{Name: dir.name + fam, KeyType: typ, IsMap: true, DataType: nftables.TypeVerdict}
			if err := r.set(m, elems); err != nil {
				return err
			}
			r.rule(judge, append(nfproto(v4), addr(v4, dir.src, reg1), &expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID})...)
		}
	}
	r.rule(judge, &expr.Verdict{Kind: expr.VerdictAccept})
	return nil
}

// all names a chain that jumps to each group in gs (each drops or
// returns): the groups' verdicts ANDed. One group is its own chain.
func (r *renderer) all(gs []int) string {
	if len(gs) == 1 {
		return "g" + strconv.Itoa(gs[0])
	}
	var ids []string
	for _, g := range gs {
		ids = append(ids, strconv.Itoa(g))
	}
	name := "all-" + strings.Join(ids, "-")
	if _, ok := r.chains[name]; !ok {
		c := r.conn.AddChain(&nftables.Chain{Name: name, Table: r.t})
		r.chains[name] = c
		for _, g := range gs {
			r.rule(c, &expr.Verdict{Kind: expr.VerdictJump, Chain: "g" + strconv.Itoa(g)})
		}
	}
	return name
}

// prelude is the engine's rules ahead of its queue.
func (r *renderer) prelude(base *nftables.Chain) {
	r.rule(base,
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0, 0, 0, 0}},
		&expr.Verdict{Kind: expr.VerdictAccept})
	r.rule(base, append(nfproto(false),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Verdict{Kind: expr.VerdictAccept})...)
	r.rule(base,
		&expr.Meta{Key: expr.MetaKeySKUID, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{0, 0, 0, 0}},
		&expr.Verdict{Kind: expr.VerdictAccept})
}

// ackBuffer holds the kernel's acknowledgement of every message of a
// program's transaction (one per rule, chain and set; each costs about a
// kilobyte of socket buffer).
const ackBuffer = 64 << 20

// NewConn is an nftables connection (in the network namespace of netnsFD,
// or this one if it is -1) whose receive buffer holds a whole program's
// acknowledgements.
func NewConn(netnsFD int) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(func(c *netlink.Conn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, ackBuffer)
		}); err != nil {
			return err
		}
		if serr != nil {
			return c.SetReadBuffer(ackBuffer) // without CAP_NET_ADMIN: up to rmem_max
		}
		return nil
	})}
	if netnsFD >= 0 {
		opts = append(opts, nftables.WithNetNSFd(netnsFD))
	}
	return nftables.New(opts...)
}

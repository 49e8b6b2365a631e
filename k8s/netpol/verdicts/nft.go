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
	// Queue is the verdict that hands a packet to the engine (its
	// NFQUEUE): a program with Queued addresses needs one.
	Queue expr.Any
}

// Existing is what the table holds before a load (Current reads it).
type Existing struct {
	Table  bool // it exists
	Chains []*nftables.Chain
	Sets   []*nftables.Set
	// Gen is the highest generation of its objects' names.
	Gen uint64
}

// Current reads what table (family inet) holds.
func Current(conn *nftables.Conn, table string) (*Existing, error) {
	out := &Existing{}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name == table {
			out.Table = true
			out.Chains = append(out.Chains, c)
			out.Gen = max(out.Gen, genOf(c.Name))
		}
	}
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	for _, t := range tables {
		if t.Name != table {
			continue
		}
		out.Table = true
		sets, err := conn.GetSets(t)
		if err != nil {
			return nil, fmt.Errorf("list sets: %w", err)
		}
		for _, s := range sets {
			out.Sets = append(out.Sets, s)
			out.Gen = max(out.Gen, genOf(s.Name))
		}
	}
	return out, nil
}

// genOf is the generation in an object's name ("…-v<gen>"), 0 if none.
func genOf(name string) uint64 {
	i := strings.LastIndex(name, "-v")
	if i < 0 {
		return 0
	}
	g, err := strconv.ParseUint(name[i+2:], 10, 64)
	if err != nil {
		return 0
	}
	return g
}

// Stable chains: the base chains keep their hooks across loads (a base
// chain deleted and added again unregisters and registers its hook, and
// packets meanwhile meet neither program), and judge, which they jump to.
const (
	chainVerdicts = "verdicts"
	chainDNS      = "dns"
	chainJudge    = "judge"
)

// Load makes table (family inet) hold p, in two transactions on conn.
// The first adds the program under the next generation's names (every
// chain and set but the stable chains); the second points the stable
// chains at it and deletes the generation before the previous one. A
// packet meets either the previous program or p: a set added in the
// same transaction as the rules that look it up can seem empty for a
// moment after the commit (pipapo's lookup structure is swapped in after
// the generation flips), so the rules only change once their sets are
// in.
func Load(conn *nftables.Conn, table string, hook Hook, p *Program) error {
	_, err := LoadGen(conn, table, hook, p)
	return err
}

// Loaded is where a program LoadGen loaded is in its table: its
// generation, and the names of its sets of peers (by Addrs id), which
// Patch changes.
type Loaded struct {
	Gen   uint64
	peers map[int32]string
}

// LoadGen is Load, and says where the program is (Patch changes it
// there).
func LoadGen(conn *nftables.Conn, table string, hook Hook, p *Program) (*Loaded, error) {
	if p.Queued != nil && hook.Queue == nil {
		return nil, fmt.Errorf("load table %s: the program queues packets to the engine, and the hook has no queue verdict", table)
	}
	cur, err := Current(conn, table)
	if err != nil {
		return nil, err
	}
	r := &renderer{conn: conn, p: p, peerSets: map[*Addrs]string{}, chains: map[string]*nftables.Chain{}, defined: map[string]*nftables.Set{},
		all: map[string]string{}, suffix: "-v" + strconv.FormatUint(cur.Gen+1, 10)}
	r.t = &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	if !cur.Table {
		conn.AddTable(r.t)
	}
	for i := range p.Groups {
		r.chains[r.gname(i)] = conn.AddChain(&nftables.Chain{Name: r.gname(i), Table: r.t})
	}
	for i, g := range p.Groups {
		if err := r.group(i, g); err != nil {
			return nil, err
		}
	}
	if err := r.dispatchSets(); err != nil {
		return nil, err
	}
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("nftables transaction (the program): %w", err)
	}
	r.dispatch(hook, cur)
	r.deleteOld(cur)
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("nftables transaction (the switch to it): %w", err)
	}
	l := &Loaded{Gen: cur.Gen + 1, peers: map[int32]string{}}
	for a, name := range r.peerSets {
		if a.id != 0 {
			l.peers[a.id] = name
		}
	}
	return l, nil
}

// Patch makes the program was, which table holds where l says (LoadGen,
// maybe patched since), take ch (was.Change), in one transaction. In the
// dispatch maps an entry of one group jumps to it (Dispatch's are all of
// one), a removed one is deleted; in the sets of peers the ranges that
// change are deleted and those they become added (an address in a set of
// ranges can join or split its neighbours). An error leaves the table as
// it was (the caller loads the program anew).
func Patch(conn *nftables.Conn, table string, l *Loaded, was *Program, ch *Change) error {
	es, changed := ch.Entries, ch.peers
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	suffix := "-v" + strconv.FormatUint(l.Gen, 10)
	// A map's entries that change go in one message of deletions and one
	// of additions (deleted first: an entry that moves to another group
	// is both): each message is an acknowledgement to read back, and a
	// message an address was most of a patch's cost under churn.
	type mapEdit struct {
		set         *nftables.Set
		gone, added []nftables.SetElement
	}
	edits := map[string]*mapEdit{}
	n := 0
	for a, e := range es {
		fam, typ := "6", nftables.TypeIP6Addr
		if a.Is4() {
			fam, typ = "4", nftables.TypeIPAddr
		}
		for _, dir := range []struct {
			name     string
			was, now []int
		}{{"egress", was.Egress[a], e.Egress}, {"ingress", was.Ingress[a], e.Ingress}} {
			if slices.Equal(dir.was, dir.now) {
				continue
			}
			if len(dir.now) > 1 {
				return fmt.Errorf("patch table %s: %s entry of %s: %d groups, want one", table, dir.name, a, len(dir.now))
			}
			name := dir.name + fam + suffix
			m := edits[name]
			if m == nil {
				m = &mapEdit{set: &nftables.Set{Table: t, Name: name, KeyType: typ, IsMap: true, DataType: nftables.TypeVerdict}}
				edits[name] = m
			}
			if len(dir.was) > 0 {
				m.gone = append(m.gone, nftables.SetElement{Key: a.AsSlice()})
			}
			if len(dir.now) == 1 {
				m.added = append(m.added, nftables.SetElement{Key: a.AsSlice(),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: "g" + strconv.Itoa(dir.now[0]) + suffix}})
			}
			n++
		}
	}
	for _, m := range edits {
		if err := replaceElements(conn, m.set, m.gone, m.added); err != nil {
			return fmt.Errorf("patch table %s: %w", table, err)
		}
	}
	for id, e := range changed {
		name, ok := l.peers[id]
		if !ok {
			return fmt.Errorf("patch table %s: set of peers %d is not in the generation loaded", table, id)
		}
		for _, v4 := range []bool{true, false} {
			fam, typ := "6", nftables.TypeIP6Addr
			if v4 {
				fam, typ = "4", nftables.TypeIPAddr
			}
			gone, added := rangesDiff(e.was, e.now, v4)
			if len(gone)+len(added) == 0 {
				continue
			}
			// Deleted first: an added range may start where a deleted
			// one did.
			s := &nftables.Set{Table: t, Name: name + "-" + fam + suffix, KeyType: typ, Interval: true}
			if err := replaceElements(conn, s, intervalElems(gone), intervalElems(added)); err != nil {
				return fmt.Errorf("patch table %s: %w", table, err)
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables transaction (patch of %d entries and sets): %w", n, err)
	}
	return nil
}

// rangesDiff are the ranges of the family (IPv4 or not) in was and not in
// now, and in now and not in was (both normalized: in order, each From
// once).
func rangesDiff(was, now []Range, v4 bool) (gone, added []Range) {
	was, now = family(was, v4), family(now, v4)
	i, j := 0, 0
	for i < len(was) || j < len(now) {
		switch {
		case j == len(now) || (i < len(was) && was[i].From.Less(now[j].From)):
			gone = append(gone, was[i])
			i++
		case i == len(was) || now[j].From.Less(was[i].From):
			added = append(added, now[j])
			j++
		default: // the same From
			if was[i].To != now[j].To {
				gone, added = append(gone, was[i]), append(added, now[j])
			}
			i, j = i+1, j+1
		}
	}
	return gone, added
}

// intervalElems are an interval set's elements for rs: each range's
// first address, and the address after its last (none after the
// family's last address).
func intervalElems(rs []Range) []nftables.SetElement {
	var elems []nftables.SetElement
	for _, rg := range rs {
		elems = append(elems, nftables.SetElement{Key: rg.From.AsSlice()})
		if next := rg.To.Next(); next.IsValid() {
			elems = append(elems, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
		}
	}
	return elems
}

func (r *renderer) gname(i int) string { return "g" + strconv.Itoa(i) + r.suffix }

// deleteOld queues the deletion of the generation before the previous
// one, and of anything else in the table but the stable chains (a
// previous engine's rules), in an order that leaves nothing referenced:
// maps (their elements jump to chains), the chains (their rules look
// sets up), then the sets. The previous generation stays until the next
// load: a packet whose evaluation began before this transaction's commit
// still runs its rules, and a set deleted under it would seem empty.
func (r *renderer) deleteOld(cur *Existing) {
	old := func(name string) bool {
		g := genOf(name)
		return g == 0 || g < cur.Gen
	}
	for _, s := range cur.Sets {
		if s.IsMap && old(s.Name) {
			r.conn.DelSet(&nftables.Set{Table: r.t, Name: s.Name})
		}
	}
	for _, pass := range []func(string) bool{
		func(n string) bool { return strings.HasPrefix(n, "all") },
		func(n string) bool { return !strings.HasPrefix(n, "all") },
	} {
		for _, c := range cur.Chains {
			if c.Name == chainVerdicts || c.Name == chainDNS || c.Name == chainJudge || !pass(c.Name) || !old(c.Name) {
				continue
			}
			r.conn.DelChain(&nftables.Chain{Table: r.t, Name: c.Name})
		}
	}
	for _, s := range cur.Sets {
		if !s.IsMap && old(s.Name) {
			r.conn.DelSet(&nftables.Set{Table: r.t, Name: s.Name})
		}
	}
}

// setChunk is how many elements go in one netlink message: a message's
// elements are one attribute, whose length has 16 bits.
const setChunk = 256

type renderer struct {
	conn     *nftables.Conn
	t        *nftables.Table
	p        *Program
	peerSets map[*Addrs]string
	chains   map[string]*nftables.Chain
	defined  map[string]*nftables.Set
	// all names the chains that AND several groups, by their groups.
	all    map[string]string
	suffix string // this generation's, on every name but the stable chains'
	judged []famSet
	queued []famSet
	maps   []famSet
}

// set queues s (named with this generation's suffix) and its elements,
// setChunk to a message.
func (r *renderer) set(s *nftables.Set, elems []nftables.SetElement) error {
	s.Table = r.t
	s.Name += r.suffix
	first := elems[:min(len(elems), setChunk)]
	if err := r.conn.AddSet(s, first); err != nil {
		return fmt.Errorf("nftables set %s: %w", s.Name, err)
	}
	if err := inChunks(elems[len(first):], func(es []nftables.SetElement) error { return r.conn.SetAddElements(s, es) }); err != nil {
		return fmt.Errorf("nftables set %s: %w", s.Name, err)
	}
	return nil
}

// inChunks calls job with elems, setChunk at a time.
// replaceElements queues the deletion of gone from s, then the addition
// of added, a message for each setChunk elements.
func replaceElements(conn *nftables.Conn, s *nftables.Set, gone, added []nftables.SetElement) error {
	if err := inChunks(gone, func(es []nftables.SetElement) error { return conn.SetDeleteElements(s, es) }); err != nil {
		return err
	}
	return inChunks(added, func(es []nftables.SetElement) error { return conn.SetAddElements(s, es) })
}

func inChunks(elems []nftables.SetElement, job func([]nftables.SetElement) error) error {
	for len(elems) > 0 {
		n := min(len(elems), setChunk)
		if err := job(elems[:n]); err != nil {
			return err
		}
		elems = elems[n:]
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
	elems := intervalElems(family(a.Ranges(), v4))
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
	chain := r.chains[r.gname(i)]
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

// dispatchSets adds the sets of judged addresses and the maps from
// addresses to the groups that judge them.
func (r *renderer) dispatchSets() error {
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
		r.judged = append(r.judged, famSet{v4: v4, set: s})
		if r.p.Queued != nil {
			var queued []nftables.SetElement
			for _, a := range sortedAddrs(r.p.Queued) {
				if a.Is4() == v4 {
					queued = append(queued, nftables.SetElement{Key: a.AsSlice()})
				}
			}
			s := &nftables.Set{Name: "queued" + fam, KeyType: typ}
			if err := r.set(s, queued); err != nil {
				return err
			}
			r.queued = append(r.queued, famSet{v4: v4, set: s})
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
				elems = append(elems, nftables.SetElement{Key: a.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: r.allOf(dir.by[a])}})
			}
			m := &nftables.Set{Name: dir.name + fam, KeyType: typ, IsMap: true, DataType: nftables.TypeVerdict}
			if err := r.set(m, elems); err != nil {
				return err
			}
			r.maps = append(r.maps, famSet{v4, m, dir.src})
		}
	}
	return nil
}

// famSet is a set of one family; src: looked up by source address.
type famSet struct {
	v4  bool
	set *nftables.Set
	src bool
}

// dispatch fills the stable chains (adding them if the table has none):
// the prelude, then a judged address's packets to judge, which looks
// their source and destination up in the maps.
func (r *renderer) dispatch(hook Hook, cur *Existing) {
	has := map[string]bool{}
	for _, c := range cur.Chains {
		has[c.Name] = true
	}
	stable := func(c *nftables.Chain) *nftables.Chain {
		c.Table = r.t
		if has[c.Name] {
			r.conn.FlushChain(c)
			return c
		}
		return r.conn.AddChain(c)
	}
	judge := stable(&nftables.Chain{Name: chainJudge})
	policy := nftables.ChainPolicyAccept
	base := stable(&nftables.Chain{Name: chainVerdicts, Type: nftables.ChainTypeFilter, Hooknum: hook.Num, Priority: hook.Priority, Policy: &policy})
	var dns *nftables.Chain
	if hook.Prelude {
		// The engine's DNS workaround (NetfilterBug1766Fix): UDP to
		// port 53 is judged after DNAT, every packet, and passes the
		// postrouting chain.
		dnsPrio := nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest + 5)
		dns = stable(&nftables.Chain{Name: chainDNS, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: dnsPrio, Policy: &policy})
		r.rule(dns, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{unix.IPPROTO_UDP}}, &expr.Verdict{Kind: expr.VerdictAccept})
		r.rule(dns, &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, &expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(53)},
			&expr.Verdict{Kind: expr.VerdictAccept})
		r.prelude(base)
	}
	// The admin policies' subjects: the engine decides (before judge, as
	// its rules queue before anything but the prelude).
	for _, q := range r.queued {
		for _, c := range []*nftables.Chain{base, dns} {
			if c == nil {
				continue
			}
			for _, src := range []bool{true, false} {
				r.rule(c, append(nfproto(q.v4), addr(q.v4, src, reg1), lookup(q.set), hook.Queue)...)
			}
		}
	}
	for _, j := range r.judged {
		for _, c := range []*nftables.Chain{base, dns} {
			if c == nil {
				continue
			}
			for _, src := range []bool{true, false} {
				r.rule(c, append(nfproto(j.v4), addr(j.v4, src, reg1), lookup(j.set), &expr.Verdict{Kind: expr.VerdictJump, Chain: judge.Name})...)
			}
		}
	}
	for _, m := range r.maps {
		r.rule(judge, append(nfproto(m.v4), addr(m.v4, m.src, reg1), &expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: m.set.Name, SetID: m.set.ID})...)
	}
	r.rule(judge, &expr.Verdict{Kind: expr.VerdictAccept})
}

// allOf names a chain that jumps to each group in gs (each drops or
// returns): the groups' verdicts ANDed. One group is its own chain.
func (r *renderer) allOf(gs []int) string {
	if len(gs) == 1 {
		return r.gname(gs[0])
	}
	var ids []string
	for _, g := range gs {
		ids = append(ids, strconv.Itoa(g))
	}
	k := strings.Join(ids, ",")
	if name, ok := r.all[k]; ok {
		return name
	}
	name := "all" + strconv.Itoa(len(r.all)) + r.suffix
	r.all[k] = name
	c := r.conn.AddChain(&nftables.Chain{Name: name, Table: r.t})
	for _, g := range gs {
		r.rule(c, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.gname(g)})
	}
	return name
}

// prelude is the engine's rules ahead of its queue.
func (r *renderer) prelude(base *nftables.Chain) {
	// UDP to port 53 is the DNS chain's.
	r.rule(base, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.BigEndian.PutUint16(53)},
		&expr.Verdict{Kind: expr.VerdictAccept})
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
// acknowledgements, with more options (nftables.AsLasting: one socket
// for every operation, not one each).
func NewConn(netnsFD int, more ...nftables.ConnOption) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(func(c *netlink.Conn) error {
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		// A transaction is one sendmsg: the send buffer must hold it.
		var rerr, serr error
		if err := raw.Control(func(fd uintptr) {
			rerr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, ackBuffer)
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, ackBuffer)
		}); err != nil {
			return err
		}
		if rerr != nil { // without CAP_NET_ADMIN: up to rmem_max
			if err := c.SetReadBuffer(ackBuffer); err != nil {
				return err
			}
		}
		if serr != nil {
			return c.SetWriteBuffer(ackBuffer)
		}
		return nil
	})}
	if netnsFD >= 0 {
		opts = append(opts, nftables.WithNetNSFd(netnsFD))
	}
	return nftables.New(append(opts, more...)...)
}

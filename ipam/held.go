package ipam

import "net/netip"

// Addresses in use on the node outside IPAM — anycast and `addresses` IPs —
// are held: no allocator hands them out and Reserve refuses them, whatever
// pool covers them now or later (a pod pool may arrive over an anycast IP
// in use), and the stats count them as taken, not free. The caller keeps
// the set (one Hold per address, however many attachments share it).

// Hold marks addr in use outside IPAM. Holding a held address is a no-op.
func (a *Allocator) Hold(addr netip.Addr) {
	addr = normAddr(addr)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.held[addr]; ok {
		return
	}
	if p := a.heldInLocked(addr); p != nil {
		p.held++
	}
	a.held[addr] = struct{}{}
}

// Unhold gives a held address back to its pool, if any covers it.
func (a *Allocator) Unhold(addr netip.Addr) {
	addr = normAddr(addr)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.held[addr]; !ok {
		return
	}
	if p := a.heldInLocked(addr); p != nil {
		p.held--
	}
	delete(a.held, addr)
}

// Held tells whether addr is held.
func (a *Allocator) Held(addr netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.held[normAddr(addr)]
	return ok
}

// heldInLocked returns the pool whose held count addr belongs in: the
// pool covering it, if addr is one of its usable addresses and nobody owns
// it (an owned address is counted as used already). It does not look at
// whether addr is held.
func (a *Allocator) heldInLocked(addr netip.Addr) *pool {
	if _, owned := a.owners[addr]; owned {
		return nil
	}
	p := a.poolOfLocked(addr)
	if p == nil {
		return nil
	}
	if v := addrToU128(addr); v == p.first || v == p.last {
		return nil // never handed out anyway
	}
	return p
}

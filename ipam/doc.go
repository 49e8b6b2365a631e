// Package ipam is flock's in-memory pod address allocator for IPv4 and
// IPv6.
//
// An Allocator is built from the node's pools (New) and hands out single
// addresses (Allocate) to an owner, normally the container ID. It keeps no
// state on disk: at agent start the caller re-Reserves every committed
// address. All methods are safe for concurrent use (one mutex).
//
// # Pools and ranges
//
// Every pool is one canonical prefix. The all-zeros and all-ones host
// addresses of a pool are never handed out nor accepted by Reserve, so a
// pool needs at least two host bits (IPv4 /30, IPv6 /126 or shorter).
// Pools must not overlap.
//
// A request without Range allocates from the family's default pool: the
// first Summary pool of that family in config order. A request with Range
// (from a cidr4/cidr6 annotation) allocates inside that prefix, which must
// lie entirely inside one pool of the requested family (else ErrNotInPool)
// whose Namespaces allow the pod's namespace (else ErrForbidden). Range may
// be any sub-prefix up to /32 resp. /128; a /128 range means exactly that
// one address. Only the pool's boundary addresses are excluded inside a
// range: the first address of a /120 range in the middle of a /64 pool is
// a normal candidate.
//
// Addresses in use on the node outside IPAM (anycast and `addresses` IPs)
// are held (Hold, Unhold): no algorithm hands them out, Reserve refuses
// them, and Stats counts them (Held) as taken, not free, whatever pool
// covers them now or later.
//
// # Algorithms (ip-algo)
//
// random (the default) draws uniformly random candidates inside the range
// and checks them against the allocations. After 32 collisions it falls
// back to a linear scan from a random start that wraps around the range and
// inspects at most min(usable addresses in range, used and held addresses
// in pool + 1) candidates: that bound guarantees finding the last free address of a
// nearly full range and lets a full range report ErrExhausted quickly,
// while never iterating over a 2^64 space.
//
// sequential hands out the lowest free address after a per-range cursor
// (the last address handed out in that range, kept in memory only),
// wrapping around at the end of the range, with the same scan bound. On an
// empty fd00::/120 pool the allocations are fd00::1, fd00::2, ...; a
// released address is reused only after the cursor wraps.
//
// embed[:<field>/<bits>[,<field>/<bits>...]] writes identity hashes into
// the host bits so that replicas of one workload share a sub-prefix, which
// makes addresses recognisable and lets policy match on them. Fields are
// ns (Identity.Namespace), app (Identity.App) and image (Identity.Image;
// when empty, Identity.ContainerID is used instead, and the request Owner
// when that is empty too), each at most once with 1..32 bits. A bare
// "embed" means "embed:ns/8,app/16,image/8". The syntax avoids '=' and ';'
// so the value fits in a CNI_ARGS value. Each field's value is the low
// <bits> bits of FNV-1a-32 of its string; fields are placed in string
// order starting at the most significant host bit of the range. The
// remaining low bits (the instance bits) are chosen like random inside the
// sub-prefix formed by range + fields. The range must have at least
// sum(bits) + 4 host bits, else the request fails with ErrBadAlgo.
//
// Example: pool fd00:10:1::/64 with embed:ns/8,app/16,image/8 uses
//
//	bits   0..63   fd00:0010:0001:0000   the range (pool) prefix
//	bits  64..71   ns hash    (8 bits)
//	bits  72..87   app hash   (16 bits)
//	bits  88..95   image hash (8 bits)
//	bits  96..127  instance   (32 bits, random)
//
// so all replicas of one ns/app/image land in the same /96.
//
// Embed applies to IPv6 only: IPv4 has too few host bits to carry identity,
// so an Embed request with Family 4 is served as random.
//
// # Errors
//
// Errors wrap the sentinels ErrExhausted, ErrNotInPool, ErrForbidden,
// ErrBadAlgo and ErrConflict for errors.Is, and their text names the values
// involved, e.g.
//
//	ipam: pool 10.0.0.0/30 exhausted (2 of 2 usable addresses in use)
//	ipam: namespace "dev" may not use pool 2001:db8:1::/112 (allowed: prod, web)
package ipam

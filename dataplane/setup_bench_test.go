package dataplane

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkSetup times one pod's veth, as an ADD programs it (the
// teardown is not timed).
func BenchmarkSetup(b *testing.B) {
	done := false
	inNewNetns(b, func(podNS string) {
		d := &Netlink{}
		for i := 0; i < b.N; i++ {
			id := fmt.Sprintf("c%d", i)
			p := Pod{ContainerID: id, HostVeth: HostVethName(id), Netns: podNS, IfName: "eth0",
				IPs:     []netip.Addr{netip.MustParseAddr("fd00:10::5"), netip.MustParseAddr("10.1.0.5")},
				HostMAC: RandomMAC(), PodMAC: RandomMAC()}
			b.StartTimer()
			if _, err := d.Setup(p); err != nil {
				b.Error(err)
				return
			}
			b.StopTimer()
			if err := d.Teardown(p.HostVeth); err != nil {
				b.Error(err)
				return
			}
		}
		done = true
	})
	if !done && !b.Failed() {
		b.Fatal("not run")
	}
}

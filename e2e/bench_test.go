package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"

	"code.fritzlab.net/fritzlab/flock/e2e/lab"
)

// BenchmarkCNIAdd measures a dual-stack CNI ADD through libcni, exactly as
// the runtime runs it, for flock and, as the baseline in the same run, the
// reference ptp plugin with host-local IPAM (also a routed veth per pod).
// Run with `make bench`; compare the ns/op (and the p50 it reports) as a
// ratio, never as absolute numbers: the machines are noisy.
func BenchmarkCNIAdd(b *testing.B) {
	cases := []struct {
		name string
		cni  func(b *testing.B) *lab.CNI
	}{
		{"flock", func(b *testing.B) *lab.CNI {
			n := startNodeB(b)
			return n
		}},
		{"ptp-baseline", func(b *testing.B) *lab.CNI {
			conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"ptp","plugins":[{"type":"ptp","ipMasq":false,
"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"fd00:20::/64"}],[{"subnet":"198.51.100.0/24"}]]}}]}`, filepath.Join(b.TempDir(), "ipam"))
			list, err := libcni.NetworkConfFromBytes([]byte(conf))
			if err != nil {
				b.Fatal(err)
			}
			exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{}, PluginDecoder: version.PluginDecoder{}}
			return &lab.CNI{Config: libcni.NewCNIConfigWithCacheDir([]string{"/usr/lib/cni"}, b.TempDir(), exec), List: list}
		}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			c := tc.cni(b)
			ns, err := lab.NewNS(randName("flkb-"))
			if err != nil {
				b.Fatal(err)
			}
			defer ns.Delete()
			ctx := context.Background()
			var lat []time.Duration
			b.ResetTimer()
			for i := range b.N {
				p := lab.Pod{ContainerID: fmt.Sprintf("bench%06d", i), NS: ns, Args: lab.PodArgs("default", fmt.Sprintf("p%d", i))}
				start := time.Now()
				if _, err := c.Add(ctx, p); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				b.StopTimer()
				if err := c.Del(ctx, p); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

var (
	benchBinOnce sync.Once
	benchBinDir  string
	benchBinErr  error
)

// startNodeB is startNode for benchmarks, with binaries built without the
// race detector (which would dominate the figures).
func startNodeB(b *testing.B) *lab.CNI {
	b.Helper()
	benchBinOnce.Do(func() {
		benchBinDir = filepath.Join(binDir, "norace")
		benchBinErr = lab.Build(benchBinDir, false)
	})
	if benchBinErr != nil {
		b.Fatal(benchBinErr)
	}
	ns, err := lab.NewNS(randName("flkn-"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ns.Delete() })
	dir := b.TempDir()
	a, err := lab.NewAgent(ns, filepath.Join(dir, "agent"), defaultConfig)
	if err != nil {
		b.Fatal(err)
	}
	a.Args = []string{"--log-level", "warn"}
	if err := a.Start(filepath.Join(benchBinDir, "flock-agent"), 30*time.Second); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Stop() })
	c, err := lab.NewCNI(benchBinDir, filepath.Join(dir, "cni-cache"), a.CNISocket, "1.1.0")
	if err != nil {
		b.Fatal(err)
	}
	return c
}

package lbcontroller

import "github.com/prometheus/client_golang/prometheus"

var (
	descLeader   = prometheus.NewDesc("flock_loadbalancer_leader", "1 while this process holds the Lease flock-loadbalancers and assigns LoadBalancer addresses.", nil, nil)
	descPool     = prometheus.NewDesc("flock_loadbalancer_pool_addresses", "Addresses of a loadBalancer AddressPool, by state (used, size); reported by the leader only.", []string{"pool", "state"}, nil)
	descFailures = prometheus.NewDesc("flock_loadbalancer_assignment_failures_total", "LoadBalancer assignments refused or failed while this process led, by reason (the allocator's code, e.g. Exhausted, InUse, NotInPool; AddressClaimFailed; StatusUpdateFailed).", []string{"reason"}, nil)
)

// Collector exports the assigner's figures (register it once).
func (c *Controller) Collector() prometheus.Collector { return collector{c} }

type collector struct{ c *Controller }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLeader
	ch <- descPool
	ch <- descFailures
}

func (m collector) Collect(ch chan<- prometheus.Metric) {
	leader := 0.0
	if m.c.Leading() {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader)
	usage, failures := m.c.stats()
	for _, p := range usage {
		ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, float64(p.Used), p.Name, "used")
		ch <- prometheus.MustNewConstMetric(descPool, prometheus.GaugeValue, float64(p.Size), p.Name, "size")
	}
	for reason, n := range failures {
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(n), reason)
	}
}

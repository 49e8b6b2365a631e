// Package netpol enforces NetworkPolicy (and AdminNetworkPolicy,
// BaselineAdminNetworkPolicy) on this node with the engine of
// sigs.k8s.io/kube-network-policies as the judge. The verdicts are
// compiled into the kernel (kernelVerdicts, package verdicts): nftables
// decides every new connection, and the rules outlive a restart. With
// the admin policies on, the first packet of each new connection from or
// to a pod one of them applies to goes to an NFQUEUE, where the engine
// decides; nftables decides every other one. flock does not write its own
// policy engine; it embeds that one, as kindnet does, with patches
// (third_party/patches, described in their README): kernels without
// nftables' queue expression queue through the xtables NFQUEUE target; a
// pod's extra IPs (anycast, `addresses`) are its own; the rules outlive a
// restart; selectors are compiled once; the engine's verdict and queue
// verdict are exported for flock's rules and the differential tests; the
// engine can leave the table to flock; it finds a packet's pods in the
// pods by IP flock keeps (podsByIP) rather than an index of its own.
package netpol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
	npaclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	npainformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
	"sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions/apis/v1alpha1"

	"code.fritzlab.net/fritzlab/flock/k8s/kubeclient"
	"code.fritzlab.net/fritzlab/flock/k8s/netpol/trim"
)

// Config is what the engine needs besides the API.
type Config struct {
	NodeName string
	// QueueID is the NFQUEUE the decisions go through (default 100).
	QueueID int
	// FailOpen lets packets pass while no process reads the queue (the
	// engine restarting); the default drops them, as a policy demands.
	FailOpen bool
	// AdminNetworkPolicy and BaselineAdminNetworkPolicy enable those APIs
	// (their CRDs must be installed). Connections from or to the pods
	// their policies apply to go through the queue.
	AdminNetworkPolicy         bool
	BaselineAdminNetworkPolicy bool
	// ExtraIPs tells the engine which pods hold the IPs the CNI binds
	// besides status.podIPs (anycast, `addresses`), so that their traffic
	// obeys the holder's policies; nil: none (agent/policyips.Tracker).
	ExtraIPs ExtraIPs
	// View, if set, is given the engine's pod and NetworkPolicy caches
	// while Run runs: flock-policy's admin API answers from it.
	View *View
	// Verdicts, if set, reports whether the kernel holds the current
	// compiled verdicts (flock-policy's readiness).
	Verdicts *Verdicts
	// Pods, if set, is where the pods are listed and watched from (the
	// relays, k8s/relay.PodSource); nil: the API server.
	Pods kubeclient.ListerWatcher[*corev1.PodList]
}

// ExtraIPs is the source of pods' extra IPs.
type ExtraIPs interface {
	ExtraPodIPs(*trim.Pod) []string
	PodsForIP(ip string) []string
	// HasSynced reports the first answer computed: the engine's first
	// rules sync waits for it.
	HasSynced() bool
	// Handler is added to the engine's pod and namespace informers: the
	// answer depends on them.
	Handler() cache.ResourceEventHandler
	// Run keeps the answer current until ctx ends, calling changed after
	// each change with the IPs whose holders changed and the pods
	// (namespace/name) whose extra IPs did; synced tells the informers
	// and the handler synced.
	Run(ctx context.Context, pods trim.PodLister, namespaces corelisters.NamespaceLister, synced []cache.InformerSynced, changed func(ips, pods []string)) error
}

// Table is the nftables table (family inet) the engine owns.
const Table = "flock-netpol"

// dnsCacheTable is the table of the engine's DNS agent (AdminNetworkPolicy
// domain peers; upstream's name): it outlives an engine that stopped.
const dnsCacheTable = "kube-network-policies-dnscache"

// Validate names the field and value that are wrong.
func (c Config) Validate() error {
	if c.NodeName == "" {
		return errors.New("netpol: node name is empty")
	}
	if c.QueueID < 0 || c.QueueID > 65535 {
		return fmt.Errorf("netpol: queue ID %d: want 0-65535", c.QueueID)
	}
	return nil
}

// Run enforces policies until ctx ends; it returns the controller's error
// (nftables or the queue could not be set up) or nil after ctx ended and
// the engine removed its table.
func Run(ctx context.Context, rc *rest.Config, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	// Protobuf for core types; the policy API is a CRD, JSON only.
	npaConfig := rest.CopyConfig(rc)
	pc := rest.CopyConfig(rc)
	pc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	pc.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(pc)
	if err != nil {
		return fmt.Errorf("netpol: kubernetes client: %w", err)
	}
	factory := newFactory(client, cfg.Pods)
	var (
		npa          npaclient.Interface
		npaFactory   npainformers.SharedInformerFactory
		nodeInformer coreinformers.NodeInformer
		anpInformer  v1alpha1.AdminNetworkPolicyInformer
		banpInformer v1alpha1.BaselineAdminNetworkPolicyInformer
	)
	if cfg.AdminNetworkPolicy || cfg.BaselineAdminNetworkPolicy {
		nodeInformer = factory.Core().V1().Nodes()
		c, err := npaclient.NewForConfig(npaConfig)
		if err != nil {
			return fmt.Errorf("netpol: network-policy-api client: %w", err)
		}
		npa, npaFactory = c, npainformers.NewSharedInformerFactory(c, 0)
		if cfg.AdminNetworkPolicy {
			anpInformer = npaFactory.Policy().V1alpha1().AdminNetworkPolicies()
		}
		if cfg.BaselineAdminNetworkPolicy {
			banpInformer = npaFactory.Policy().V1alpha1().BaselineAdminNetworkPolicies()
		}
	}
	native, err := nftQueueWorks()
	if err != nil {
		return err
	}
	if !native {
		log.Info("this kernel has no nftables queue expression (nft_queue): queueing through the xtables NFQUEUE target")
	}
	if !cfg.AdminNetworkPolicy {
		// A DNS agent of an earlier engine with AdminNetworkPolicy on
		// left its table; nothing reads its queue now.
		if err := networkpolicy.DeleteTable(dnsCacheTable); err != nil {
			log.Warn("removing the DNS agent's old table", "table", dnsCacheTable, "err", err)
		}
	}
	if ok, err := sctpSupported(); err == nil && !ok {
		log.Warn("this kernel has no SCTP: no pod can use it, so NetworkPolicy rules for SCTP ports match no traffic")
	}
	// The pods by status IP: the engine's lookups and the kernel
	// verdicts' holders, kept by the kernel verdicts' pod handler (below);
	// complete once that handler was told of the first list.
	ips := newPodsByIP()
	var indexed atomic.Pointer[func() bool]
	ipsSynced := func() bool { f := indexed.Load(); return f != nil && (*f)() }
	engineCfg := networkpolicy.Config{
		FailOpen:                   cfg.FailOpen,
		AdminNetworkPolicy:         cfg.AdminNetworkPolicy,
		BaselineAdminNetworkPolicy: cfg.BaselineAdminNetworkPolicy,
		QueueID:                    cfg.QueueID,
		NodeName:                   cfg.NodeName,
		NFTableName:                Table,
		// The kernel fix is in 6.12; older kernels need the
		// workaround for DNS over conntrack races.
		NetfilterBug1766Fix: true,
		// Pod IPs come from the API: flock publishes them before ADD
		// returns, and NRI is off on the nodes flock supports.
		NRIdisabled: true,
		QueueCompat: !native,
		// A restart or a crash leaves the rules: new connections
		// of selected pods wait in the queue (dropped unless
		// FailOpen) rather than pass unchecked. flock-policy removes
		// the table on uninstall (DeleteTable).
		KeepRulesOnStop: true,
		// flock writes the rules (kernelVerdicts): the engine judges
		// only what they queue to it.
		NoRules:        true,
		ExtraPodIPs:    engineExtraPodIPs(extraPodIPs(cfg.ExtraIPs)),
		PodsForIP:      podsForIP(cfg.ExtraIPs),
		ExtraIPsSynced: allSynced(extraSynced(cfg.ExtraIPs), ipsSynced),
		PodsByIP:       enginePodsByIP(ips.lookup),
	}
	ctrl, err := newController(client, factory, nodeInformer, npa, anpInformer, banpInformer, engineCfg)
	if err != nil {
		return err
	}
	podInf, nsInf := factory.Core().V1().Pods(), factory.Core().V1().Namespaces()
	extraDone := make(chan error, 1)
	var extraSynced []cache.InformerSynced
	if cfg.ExtraIPs != nil {
		if extraSynced, err = addHandler(cfg.ExtraIPs.Handler(), podInf.Informer(), nsInf.Informer()); err != nil {
			return fmt.Errorf("netpol: watch for extra pod IPs: %w", err)
		}
	}
	if cfg.View != nil {
		// The informers the controller registered: the view reads what
		// the engine decides from, at no extra watch.
		pods, policies := factory.Core().V1().Pods(), factory.Networking().V1().NetworkPolicies()
		cfg.View.attach(&viewSource{node: cfg.NodeName, pods: trim.NewPodLister(pods.Informer().GetIndexer()), policies: policies.Lister(), extraIPs: extraPodIPs(cfg.ExtraIPs),
			synced: []cache.InformerSynced{pods.Informer().HasSynced, policies.Informer().HasSynced}})
		// Stopped informers no longer follow the API.
		defer cfg.View.attach(nil)
	}
	nps := factory.Networking().V1().NetworkPolicies()
	watched := []cache.SharedIndexInformer{podInf.Informer(), nsInf.Informer(), nps.Informer()}
	names := []string{"pods", "namespaces", "NetworkPolicies"} // in the log of a long wait
	var admin *adminListers
	if anpInformer != nil || banpInformer != nil {
		admin = &adminListers{}
		if anpInformer != nil {
			admin.anps = anpInformer.Lister()
			watched = append(watched, anpInformer.Informer())
			names = append(names, "AdminNetworkPolicies")
		}
		if banpInformer != nil {
			admin.banps = banpInformer.Lister()
			watched = append(watched, banpInformer.Informer())
			names = append(names, "BaselineAdminNetworkPolicies")
		}
	}
	var synced []kubeclient.Synced
	for i, inf := range watched {
		synced = append(synced, kubeclient.Synced{Name: names[i], Synced: inf.HasSynced})
	}
	synced = append(synced, kubeclient.Synced{Name: "the pods by IP", Synced: ipsSynced})
	podLister := trim.NewPodLister(podInf.Informer().GetIndexer())
	kv := newKernelVerdicts(cfg.NodeName, podLister, nsInf.Lister(), nps.Lister(), cfg.ExtraIPs, synced, log)
	kv.admin = admin
	kv.ips, kv.holders = ips, ips.lookup
	kv.hook.Queue = networkpolicy.QueueVerdict(engineCfg)
	for i, inf := range watched {
		reg, err := inf.AddEventHandler(kv.handler())
		if err != nil {
			return fmt.Errorf("netpol: watch for the kernel's verdicts: %w", err)
		}
		if i == 0 { // the pods' (Informer() is a new value at each call)
			hasSynced := reg.HasSynced
			indexed.Store(&hasSynced)
		}
	}
	if cfg.Verdicts != nil {
		cfg.Verdicts.kv.Store(kv)
		defer cfg.Verdicts.kv.Store(nil)
	}
	factory.Start(ctx.Done())
	if npaFactory != nil {
		npaFactory.Start(ctx.Done())
	}
	log.Info("network policy engine starting", "node", cfg.NodeName, "queue", cfg.QueueID, "table", Table,
		"adminNetworkPolicy", cfg.AdminNetworkPolicy, "baselineAdminNetworkPolicy", cfg.BaselineAdminNetworkPolicy, "failOpen", cfg.FailOpen)
	start := time.Now()
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	changed := func(ips, pods []string) { ctrl.Resync(); kv.extraChanged(ips, pods) }
	kvDone := make(chan struct{})
	go func() { defer close(kvDone); _ = kv.Run(runCtx) }()
	// Stop it before waiting for it, also when Run panics.
	defer func() { stopRun(nil); <-kvDone }()
	if cfg.ExtraIPs != nil {
		go func() {
			err := cfg.ExtraIPs.Run(runCtx, podLister, nsInf.Lister(), extraSynced, changed)
			if err != nil && runCtx.Err() == nil {
				// Without it traffic of extra IPs would go unchecked:
				// stop the engine (its rules stay; the next one starts).
				stopRun(err)
			}
			extraDone <- err
		}()
	} else {
		extraDone <- nil
	}
	err = ctrl.Run(runCtx)
	stopRun(nil)
	if xerr := <-extraDone; xerr != nil && ctx.Err() == nil {
		err = errors.Join(err, fmt.Errorf("netpol: extra pod IPs: %w", xerr))
	}
	factory.Shutdown()
	if npaFactory != nil {
		npaFactory.Shutdown()
	}
	if err == nil && ctx.Err() == nil && context.Cause(runCtx) != nil {
		err = context.Cause(runCtx)
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("netpol: controller stopped after %s: %w", time.Since(start).Round(time.Second), err)
	}
	return nil
}

// newFactory makes the informers of client: they cache pods, namespaces
// and nodes trimmed to what flock-policy reads, and other objects
// without their managed fields (trim.Transform). Its pod informer (the
// engine's, the view's, the tracker's) reads pods (nil: client), and its
// handlers share one listener (oneListener): registered first, it is the
// one the factory hands out.
func newFactory(client kubernetes.Interface, pods kubeclient.ListerWatcher[*corev1.PodList]) informers.SharedInformerFactory {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trim.Transform))
	f.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		if pods != nil {
			// Its watches' pods are *trim.Pod (k8s/relay.PodSource
			// decodes them so); its lists' are trimmed by the transform.
			return newOneListener(kubeclient.NewInformer(pods, &trim.Pod{}, nil))
		}
		return newOneListener(coreinformers.NewPodInformer(c, metav1.NamespaceAll, resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}))
	})
	return f
}

// newController builds the engine on factory's informers, the pod
// informer in the engine's form (enginePods). trim's transform is set on
// it before anything starts it (SetTransform fails after): the engine's
// own is not.
func newController(client kubernetes.Interface, factory informers.SharedInformerFactory, nodes coreinformers.NodeInformer,
	npa npaclient.Interface, anps v1alpha1.AdminNetworkPolicyInformer, banps v1alpha1.BaselineAdminNetworkPolicyInformer,
	cfg networkpolicy.Config) (*networkpolicy.Controller, error) {
	ctrl, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(), enginePods{factory.Core().V1().Pods().Informer(), cfg.NodeName},
		nodes, npa, anps, banps, cfg)
	if err != nil {
		return nil, fmt.Errorf("netpol: create controller: %w", err)
	}
	if err := factory.Core().V1().Pods().Informer().SetTransform(trim.Transform); err != nil {
		return nil, fmt.Errorf("netpol: trim the pod cache: %w", err)
	}
	return ctrl, nil
}

// addHandler adds h to each informer and returns what tells they synced:
// their stores and h's having been told of every object in them. The
// extra IPs' first answer waits for both, since the tracker keeps state
// of its own from what h is told (the pods asking for anycast), and
// client-go delivers a new handler the store's objects on its own time.
func addHandler(h cache.ResourceEventHandler, infs ...cache.SharedIndexInformer) ([]cache.InformerSynced, error) {
	var synced []cache.InformerSynced
	for _, inf := range infs {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return nil, err
		}
		synced = append(synced, inf.HasSynced, reg.HasSynced)
	}
	return synced, nil
}

func extraPodIPs(x ExtraIPs) func(*trim.Pod) []string {
	if x == nil {
		return nil
	}
	return x.ExtraPodIPs
}

func podsForIP(x ExtraIPs) func(string) []string {
	if x == nil {
		return nil
	}
	return x.PodsForIP
}

// DeleteTable removes the engine's rules: on uninstall only, since a
// stopped engine leaves them on purpose (Config.KeepRulesOnStop).
func DeleteTable() error {
	return errors.Join(networkpolicy.DeleteTable(Table), networkpolicy.DeleteTable(dnsCacheTable))
}

func extraSynced(x ExtraIPs) func() bool {
	if x == nil {
		return nil
	}
	return x.HasSynced
}

// allSynced is true once each of fs (nil: none) is.
func allSynced(fs ...func() bool) func() bool {
	return func() bool {
		for _, f := range fs {
			if f != nil && !f() {
				return false
			}
		}
		return true
	}
}

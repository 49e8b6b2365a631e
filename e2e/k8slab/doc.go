// Package k8slab runs a real single-node Kubernetes on the test host so that
// flock can be driven the way kubelet really drives a CNI plugin: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd with
// runc, and kubelet, each a process of its own with its log under
// Options.Dir/logs. Nothing is pulled from a registry: the Kubernetes
// binaries are built from the Go module proxy (module ./build), and the
// sandbox and busybox images are packed locally and imported into
// containerd.
//
// There is no kube-proxy. The lab DNATs the kubernetes Service address
// (10.96.0.1:443) to the apiserver for connections made from the host
// network namespace, which is where hostNetwork pods live.
//
// Everything needs root. Down stops only what Up started, by PID, and
// restores the host settings that Up or kubelet changed.
package k8slab

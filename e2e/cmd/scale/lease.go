package main

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// holdLoadBalancerLease keeps the LoadBalancer assigner's Lease
// (flock-system/flock-loadbalancers) held by a model node until ctx ends,
// renewing it as a leader would: the measured node is one of the 4,999
// that do not lead, as almost every node is.
func holdLoadBalancerLease(ctx context.Context, cs kubernetes.Interface) {
	const ns, name = "flock-system", "flock-loadbalancers"
	leases := cs.CoordinationV1().Leases(ns)
	for {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(nodeName(0)), LeaseDurationSeconds: ptr.To[int32](15),
					AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
		case err == nil:
			l.Spec.HolderIdentity, l.Spec.RenewTime = ptr.To(nodeName(0)), &now
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			logf("the LoadBalancer Lease: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

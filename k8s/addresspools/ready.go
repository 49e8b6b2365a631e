package addresspools

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// ValidMessage is the message of a valid pool's Ready condition.
const ValidMessage = "valid: the agents use the pool"

// maxMessage bounds a condition's message (the API allows 32768).
const maxMessage = 4096

// Verdict is the Ready condition an AddressPool should show, for its
// generation: True (ReasonValid) if invalid is nil, else False
// (ReasonInvalidSpec) with invalid's message, in one line.
func Verdict(generation int64, invalid error) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid,
		Message: ValidMessage, ObservedGeneration: generation}
	if invalid != nil {
		msg := strings.ReplaceAll(invalid.Error(), "\n", "; ")
		if r := []rune(msg); len(r) > maxMessage {
			msg = string(r[:maxMessage-3]) + "..."
		}
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, msg
	}
	return c
}

// UpdateReady writes the Ready condition (status.conditions, through the
// status subresource) of every cached pool: False, reason InvalidSpec,
// with the error for a pool that does not convert or that invalid names
// (authz.Compile's Invalid of the AddressPools alone, which every agent
// computes alike), True otherwise. The writes are idempotent and
// conflict-safe, as several agents make them: a condition that already
// says so is not written (its transition time stays), nor is one of a
// newer generation than this agent's cache has (a newer writer is
// right); a conflict is retried once against the object as the API
// server has it now, unless that shows the verdict already or its spec
// moved on (this agent's cache is behind: its next call decides). A pool
// deleted meanwhile is skipped. The errors of all pools are joined.
func (w *Watcher) UpdateReady(ctx context.Context, invalid map[string]error) error {
	var errs []error
	for _, u := range w.cached() {
		name := u.GetName()
		bad := invalid[name]
		if _, err := convert(u); err != nil {
			bad = err
		}
		want := Verdict(u.GetGeneration(), bad)
		err := w.writeReady(ctx, u.DeepCopy(), want)
		if apierrors.IsConflict(err) {
			var fresh *unstructured.Unstructured
			fresh, err = w.dyn.Resource(GVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && fresh.GetGeneration() == want.ObservedGeneration {
				err = w.writeReady(ctx, fresh, want)
			}
		}
		switch {
		case err == nil, apierrors.IsNotFound(err):
		default:
			errs = append(errs, fmt.Errorf("AddressPool %s: write the Ready condition (%s): %w", name, want.Status, err))
		}
	}
	return errors.Join(errs...)
}

// writeReady puts want into u's status.conditions and writes u, unless it
// shows want already or a verdict on a newer generation.
func (w *Watcher) writeReady(ctx context.Context, u *unstructured.Unstructured, want metav1.Condition) error {
	conds, err := conditionsOf(u)
	broken := err != nil // someone wrote what does not convert: rewrite it
	if cur := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); cur != nil && !broken {
		if cur.ObservedGeneration > want.ObservedGeneration {
			return nil
		}
		if cur.Status == want.Status && cur.Reason == want.Reason && cur.Message == want.Message &&
			cur.ObservedGeneration == want.ObservedGeneration {
			return nil
		}
	}
	if broken {
		conds = nil
	}
	meta.SetStatusCondition(&conds, want) // a new status gets a new transition time
	list := make([]any, 0, len(conds))
	for i := range conds {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&conds[i])
		if err != nil {
			return err
		}
		list = append(list, m)
	}
	if err := unstructured.SetNestedSlice(u.Object, list, "status", "conditions"); err != nil {
		return err
	}
	_, err = w.dyn.Resource(GVR).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}

// conditionsOf reads status.conditions.
func conditionsOf(u *unstructured.Unstructured) ([]metav1.Condition, error) {
	raw, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "conditions")
	if !ok || raw == nil {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("status.conditions: %T, not a list", raw)
	}
	var out []metav1.Condition
	for i, x := range list {
		m, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("status.conditions[%d]: %T, not an object", i, x)
		}
		var c metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err != nil {
			return nil, fmt.Errorf("status.conditions[%d]: %w", i, err)
		}
		out = append(out, c)
	}
	return slices.Clip(out), nil
}

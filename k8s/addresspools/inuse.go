package addresspools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"code.fritzlab.net/fritzlab/flock/k8s/apis/v1alpha1"
)

// UpdateInUse writes this node's entry of status.inUse on every cached
// pool: want[pool] (an absent or empty one removes the entry). Unlike
// status.claims, what each agent sees differs by node, so each writes only
// its own entry and leaves the others' as the API server has them; a pool
// whose entry is already right is not written. Entries of nodes for which
// live says false (their NodeConfig is gone) are dropped on the way: every
// agent agrees on that, so the first to write does it. live nil keeps
// every entry. A conflict is retried once against the object as the API
// server has it now; a pool deleted meanwhile is skipped. The errors of
// all pools are joined.
func (w *Watcher) UpdateInUse(ctx context.Context, node string, want map[string]v1alpha1.NodeInUse, live func(node string) bool) error {
	var errs []error
	for _, u := range w.cached() {
		name := u.GetName()
		mine := want[name]
		mine.Node = node
		err := w.writeInUse(ctx, u.DeepCopy(), mine, live)
		if apierrors.IsConflict(err) {
			var fresh *unstructured.Unstructured
			fresh, err = w.dyn.Resource(GVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				err = w.writeInUse(ctx, fresh, mine, live)
			}
		}
		switch {
		case err == nil, apierrors.IsNotFound(err):
		default:
			errs = append(errs, fmt.Errorf("AddressPool %s: write status.inUse of node %s: %w", name, node, err))
		}
	}
	return errors.Join(errs...)
}

// writeInUse puts mine into u's status.inUse (replacing the node's entry,
// removing it when mine lists nothing) and writes u if that changed it.
func (w *Watcher) writeInUse(ctx context.Context, u *unstructured.Unstructured, mine v1alpha1.NodeInUse, live func(string) bool) error {
	cur, err := inUseOf(u)
	broken := err != nil // someone wrote what does not convert: rewrite it
	next := slices.DeleteFunc(slices.Clone(cur), func(e v1alpha1.NodeInUse) bool {
		return e.Node == mine.Node || (live != nil && !live(e.Node))
	})
	if mine.Count > 0 {
		next = append(next, mine)
	}
	slices.SortFunc(next, func(a, b v1alpha1.NodeInUse) int { return strings.Compare(a.Node, b.Node) })
	if !broken && sameInUse(cur, next) {
		return nil
	}
	if len(next) == 0 {
		unstructured.RemoveNestedField(u.Object, "status", "inUse") // omitempty, as the Go type
	} else {
		list := make([]any, 0, len(next))
		for i := range next {
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&next[i])
			if err != nil {
				return err
			}
			list = append(list, m)
		}
		if err := unstructured.SetNestedSlice(u.Object, list, "status", "inUse"); err != nil {
			return err
		}
	}
	_, err = w.dyn.Resource(GVR).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	return err
}

func sameInUse(a, b []v1alpha1.NodeInUse) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	// As JSON: a list the API server returned and one built here differ
	// only in nil against empty.
	ja, erra := json.Marshal(a)
	jb, errb := json.Marshal(b)
	return erra == nil && errb == nil && bytes.Equal(ja, jb)
}

// inUseOf reads status.inUse, sorted by node.
func inUseOf(u *unstructured.Unstructured) ([]v1alpha1.NodeInUse, error) {
	raw, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "status")
	if !ok {
		return nil, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, nil
	}
	var st v1alpha1.AddressPoolStatus
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	slices.SortFunc(st.InUse, func(a, b v1alpha1.NodeInUse) int { return strings.Compare(a.Node, b.Node) })
	return st.InUse, nil
}

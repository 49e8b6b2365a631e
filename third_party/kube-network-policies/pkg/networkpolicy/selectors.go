package networkpolicy

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// selectorOf is metav1.LabelSelectorAsSelector, compiled once per
// selector: the packet path matched every policy's selectors anew for
// each new connection, and compiling them was most of its CPU. Informer
// objects are never changed in place, so a selector's address names its
// content; the cache holds the pointer, so the address is not reused
// while it is cached, and it is emptied when it grows past selectorsMax
// (updated and deleted objects' selectors go then).
func selectorOf(ls *metav1.LabelSelector) (labels.Selector, error) {
	selectors.mu.Lock()
	defer selectors.mu.Unlock()
	if r, ok := selectors.m[ls]; ok {
		return r.sel, r.err
	}
	if len(selectors.m) >= selectorsMax {
		clear(selectors.m)
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	selectors.m[ls] = compiledSelector{sel, err}
	return sel, err
}

const selectorsMax = 8192

type compiledSelector struct {
	sel labels.Selector
	err error
}

var selectors = struct {
	mu sync.Mutex
	m  map[*metav1.LabelSelector]compiledSelector
}{m: map[*metav1.LabelSelector]compiledSelector{}}

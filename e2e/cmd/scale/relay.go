package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"code.fritzlab.net/fritzlab/flock/k8s/relay"
)

// relayResource names what flock-policy reads from the relay in the
// tables (the relay sends pods).
const relayResource = "pods (from the relay)"

// relayAccess gives flock-policy what deploy/relay gives the policy
// container: a token for the relays' audience, of a ServiceAccount that
// may list and watch pods (the relay asks the API server both).
func (m *measuredNode) relayAccess(ctx context.Context, cs kubernetes.Interface) error {
	const ns, sa, role = "flock-system", "flock-scale-node", "flock-scale-pod-reader"
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("relay: service account: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("relay: role: %w", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return fmt.Errorf("relay: role binding: %w", err)
	}
	// A day: longer than any run (the kubelet would rotate it).
	day := int64(24 * 3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{relay.Audience}, ExpirationSeconds: &day}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("relay: token: %w", err)
	}
	m.relayToken = filepath.Join(m.dir, "relay-token")
	return os.WriteFile(m.relayToken, []byte(tr.Status.Token), 0o600)
}

// relaySent is what the relay has sent so far (its counters): the
// events and the bytes, as written (compressed). It serves only the
// measured node's flock-policy.
func (m *measuredNode) relaySent() (watchStat, error) {
	code, body, err := m.httpGetBody("http://" + relayMetrics + "/metrics")
	if err != nil {
		return watchStat{}, err
	}
	if code != 200 {
		return watchStat{}, fmt.Errorf("relay metrics: HTTP %d", code)
	}
	return parseRelayMetrics(body)
}

func parseRelayMetrics(body []byte) (watchStat, error) {
	var ws watchStat
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *int64
		switch name {
		case "flock_relay_events_sent_total":
			dst = &ws.events
		case "flock_relay_sent_bytes_total":
			dst = &ws.bytes
		default:
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return ws, fmt.Errorf("relay metrics: %s %q: %w", name, v, err)
		}
		*dst = int64(f)
		found++
	}
	if found != 2 {
		return ws, fmt.Errorf("relay metrics: want flock_relay_events_sent_total and flock_relay_sent_bytes_total, found %d of them", found)
	}
	return ws, nil
}

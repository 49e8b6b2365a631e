package k8slab

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteTokenKubeconfig writes a kubeconfig that authenticates with a
// bearer token (a ServiceAccount's, to test its RBAC for real).
func (c *Cluster) WriteTokenKubeconfig(path, token string) error {
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8slab
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: token
  user:
    token: %s
contexts:
- name: token@k8slab
  context: {cluster: k8slab, user: token}
current-context: token@k8slab
`, c.APIServerURL(), filepath.Join(c.pkiDir(), "ca.crt"), token)
	return os.WriteFile(path, []byte(body), 0o600)
}

// writeKubeconfig writes a client-certificate kubeconfig for the user whose
// cert/key pair is pki/<user>.{crt,key}.
func (c *Cluster) writeKubeconfig(user string) (string, error) {
	pki := c.pkiDir()
	path := filepath.Join(c.Opts.Dir, user+".kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8slab
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: %s@k8slab
  context: {cluster: k8slab, user: %s}
current-context: %s@k8slab
`, c.APIServerURL(), filepath.Join(pki, "ca.crt"), user,
		filepath.Join(pki, user+".crt"), filepath.Join(pki, user+".key"), user, user, user)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		return "", fmt.Errorf("write %s kubeconfig: %w", user, err)
	}
	return path, nil
}

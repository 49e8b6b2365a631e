package k8slab

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// APIServerURL is where the apiserver listens: loopback, or with
// Services the node's primary address.
func (c *Cluster) APIServerURL() string {
	return "https://" + net.JoinHostPort(c.apiServerHost(), strconv.Itoa(APIServerPort))
}

// TLSConfig trusts the lab CA and presents the admin client certificate;
// serverName is checked against the apiserver's SANs ("" for the default).
func (c *Cluster) TLSConfig(serverName string) (*tls.Config, error) {
	pki := c.pkiDir()
	caPEM, err := os.ReadFile(filepath.Join(pki, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read lab CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("lab CA %s holds no certificate", filepath.Join(pki, "ca.crt"))
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(pki, "admin.crt"), filepath.Join(pki, "admin.key"))
	if err != nil {
		return nil, fmt.Errorf("load admin certificate: %w", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: serverName}, nil
}

func (c *Cluster) apiClient() (*http.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.http != nil {
		return c.http, nil
	}
	cfg, err := c.TLSConfig("")
	if err != nil {
		return nil, err
	}
	c.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	return c.http, nil
}

// api makes one request to the apiserver as admin and returns the status
// code and body.
func (c *Cluster) api(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	hc, err := c.apiClient()
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.APIServerURL()+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("build %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	return resp.StatusCode, b, nil
}

// PID is the process ID of a control-plane component the lab started
// (etcd, kube-apiserver, …); 0 if it is not running.
func (c *Cluster) PID(component string) int {
	p := c.proc(component)
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
	}
	return p.cmd.Process.Pid
}

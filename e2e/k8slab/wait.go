package k8slab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// fatalError ends a poll at once: waiting longer cannot help.
type fatalError struct{ error }

func (f fatalError) Unwrap() error { return f.error }

// poll calls check every interval until it reports done, returns a
// fatalError, or ctx ends. Other errors only mean "not yet"; the last one is
// part of the timeout report.
func poll(ctx context.Context, what string, interval time.Duration, check func(ctx context.Context) (bool, error)) error {
	var last error
	for {
		done, err := check(ctx)
		if done {
			return nil
		}
		var fe fatalError
		if errors.As(err, &fe) {
			return fmt.Errorf("wait for %s: %w", what, fe.error)
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("wait for %s: %w (last: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
	}
}

// WaitAPIServer waits until /readyz answers ok.
func (c *Cluster) WaitAPIServer(ctx context.Context) error {
	return poll(ctx, "kube-apiserver /readyz", 250*time.Millisecond, func(ctx context.Context) (bool, error) {
		if p := c.proc(APIServer); p != nil && !p.running() {
			return false, fatalError{p.exitErr()}
		}
		code, body, err := c.api(ctx, http.MethodGet, "/readyz", nil)
		if err != nil {
			return false, err
		}
		if code != http.StatusOK {
			return false, fmt.Errorf("readyz: %d %s", code, tail(string(body), 5))
		}
		return true, nil
	})
}

// node is the part of a Node object the lab looks at.
type node struct {
	Status struct {
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

func (c *Cluster) getNode(ctx context.Context) (*node, error) {
	return c.getNodeNamed(ctx, c.Opts.NodeName)
}

func (c *Cluster) getNodeNamed(ctx context.Context, name string) (*node, error) {
	code, body, err := c.api(ctx, http.MethodGet, "/api/v1/nodes/"+name, nil)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("get node %s: %d", name, code)
	}
	var n node
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("decode node %s: %w", name, err)
	}
	return &n, nil
}

// waitNodeRegistered waits until kubelet has created its Node object.
func (c *Cluster) waitNodeRegistered(ctx context.Context) error {
	return poll(ctx, "node "+c.Opts.NodeName+" to register", 500*time.Millisecond, func(ctx context.Context) (bool, error) {
		if p := c.proc(Kubelet); p != nil && !p.running() {
			return false, fatalError{p.exitErr()}
		}
		_, err := c.getNode(ctx)
		return err == nil, err
	})
}

// WaitNodeReady waits until the node's Ready condition is True. kubelet
// reports NotReady until a CNI config exists in CNIConfDir.
func (c *Cluster) WaitNodeReady(ctx context.Context) error {
	return c.waitReadyNamed(ctx, c.Opts.NodeName)
}

func (c *Cluster) waitReadyNamed(ctx context.Context, name string) error {
	return poll(ctx, "node "+name+" Ready", time.Second, func(ctx context.Context) (bool, error) {
		n, err := c.getNodeNamed(ctx, name)
		if err != nil {
			return false, err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == "Ready" {
				if cond.Status == "True" {
					return true, nil
				}
				return false, errors.New("Ready=" + cond.Status + ": " + cond.Message)
			}
		}
		return false, errors.New("no Ready condition yet")
	})
}

// ensureDefaultServiceAccount waits a few seconds for the controller
// manager to create default/default and creates it when it has not.
func (c *Cluster) ensureDefaultServiceAccount(ctx context.Context) error {
	const path = "/api/v1/namespaces/default/serviceaccounts"
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := poll(wctx, "default service account", 500*time.Millisecond, func(ctx context.Context) (bool, error) {
		code, _, err := c.api(ctx, http.MethodGet, path+"/default", nil)
		return err == nil && code == http.StatusOK, err
	})
	cancel()
	if err == nil {
		return nil
	}
	c.Opts.Log("k8slab: controller manager did not create default/default; creating it")
	body := []byte(`{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"default","namespace":"default"}}`)
	code, resp, err := c.api(ctx, http.MethodPost, path, body)
	if err != nil {
		return fmt.Errorf("create default service account: %w", err)
	}
	if code != http.StatusCreated && code != http.StatusConflict {
		return fmt.Errorf("create default service account: %d %s", code, tail(string(resp), 5))
	}
	return nil
}

// waitHTTPOK polls url until it answers 200, failing at once when the
// component exits.
func (c *Cluster) waitHTTPOK(ctx context.Context, name, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return poll(ctx, name+" "+url, 200*time.Millisecond, func(ctx context.Context) (bool, error) {
		if p := c.proc(name); !p.running() {
			return false, fatalError{p.exitErr()}
		}
		return httpOK(ctx, url)
	})
}

// httpOK is one GET of url: 200 is done, anything else is the error kept
// for the timeout message.
func httpOK(ctx context.Context, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, fmt.Errorf("GET %s: %s", url, resp.Status)
}

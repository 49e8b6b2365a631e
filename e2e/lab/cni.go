package lab

import (
	"context"
	"fmt"
	"os"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// CNI invokes the real flock plugin binary through libcni, exactly as
// containerd does (network config list, runtime conf, result cache).
type CNI struct {
	Config *libcni.CNIConfig
	List   *libcni.NetworkConfigList
}

// NewCNI builds a libcni client for a flock network whose plugin talks to
// socket. binDir holds the flock binary; cacheDir is libcni's result cache.
func NewCNI(binDir, cacheDir, socket, cniVersion string) (*CNI, error) {
	conf := fmt.Sprintf(`{"cniVersion":%q,"name":"flock","plugins":[{"type":"flock","socket":%q}]}`, cniVersion, socket)
	list, err := libcni.NetworkConfFromBytes([]byte(conf))
	if err != nil {
		return nil, err
	}
	// An explicit exec: libcni's lazy default is initialised without a lock,
	// which races when a runtime (or a test) runs ADDs concurrently.
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	return &CNI{Config: libcni.NewCNIConfigWithCacheDir([]string{binDir}, cacheDir, exec), List: list}, nil
}

// Pod is one sandbox attachment.
type Pod struct {
	ContainerID string
	NS          *NS
	IfName      string
	Args        [][2]string // CNI_ARGS
}

func (p Pod) rt() *libcni.RuntimeConf {
	ifName := p.IfName
	if ifName == "" {
		ifName = "eth0"
	}
	return &libcni.RuntimeConf{ContainerID: p.ContainerID, NetNS: p.NS.Path, IfName: ifName, Args: p.Args}
}

// Add runs ADD.
func (c *CNI) Add(ctx context.Context, p Pod) (types.Result, error) {
	return c.Config.AddNetworkList(ctx, c.List, p.rt())
}

// Del runs DEL.
func (c *CNI) Del(ctx context.Context, p Pod) error {
	return c.Config.DelNetworkList(ctx, c.List, p.rt())
}

// Check runs CHECK (with the cached result as prevResult).
func (c *CNI) Check(ctx context.Context, p Pod) error {
	return c.Config.CheckNetworkList(ctx, c.List, p.rt())
}

// Status runs STATUS.
func (c *CNI) Status(ctx context.Context) error { return c.Config.GetStatusNetworkList(ctx, c.List) }

// GC runs GC with the given valid attachments.
func (c *CNI) GC(ctx context.Context, valid []types.GCAttachment) error {
	return c.Config.GCNetworkList(ctx, c.List, &libcni.GCArgs{ValidAttachments: valid})
}

// PodArgs is the CNI_ARGS a kubelet would pass for namespace/name, plus
// extra pairs (flock annotations in standalone mode).
func PodArgs(namespace, name string, extra ...string) [][2]string {
	args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}
	for i := 0; i+1 < len(extra); i += 2 {
		args = append(args, [2]string{extra[i], extra[i+1]})
	}
	return args
}

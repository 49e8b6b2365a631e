// Command flock-installer installs the flock CNI plugin and its network
// config on the host (the DaemonSet's init container).
package main

import (
	"flag"
	"fmt"
	"os"

	"code.fritzlab.net/fritzlab/flock/cni/install"
	"code.fritzlab.net/fritzlab/flock/cni/wire"
)

func main() {
	var o install.Options
	flag.StringVar(&o.PluginSrc, "plugin", "/opt/flock/bin/flock", "plugin binary to install")
	flag.StringVar(&o.CNIBinDir, "cni-bin-dir", "/host/opt/cni/bin", "host CNI plugin directory")
	flag.StringVar(&o.CNIConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "host CNI config directory")
	flag.StringVar(&o.Socket, "socket", wire.DefaultSocket, "agent CNI socket path, as seen by the plugin on the host")
	flag.BoolVar(&o.Portmap, "portmap", false, "chain the portmap plugin (hostPort support)")
	flag.BoolVar(&o.Bandwidth, "bandwidth", false, "chain the bandwidth plugin")
	flag.StringVar(&o.CNIVersion, "cni-version", "1.1.0", "cniVersion of the conflist (containerd 1.6 needs 1.0.0)")
	flag.Parse()
	changed, err := install.Install(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flock-installer:", err)
		os.Exit(1)
	}
	if len(changed) == 0 {
		fmt.Println("flock-installer: already up to date")
	}
	for _, c := range changed {
		fmt.Println("flock-installer: installed", c)
	}
}

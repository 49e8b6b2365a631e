// Command fakeplugin answers CNI VERSION with the versions baked in at
// build time (-ldflags -X main.versions=0.3.1,1.1.0), statically linked so
// it runs chrooted into a directory that holds nothing else.
package main

import (
	"encoding/json"
	"os"
	"strings"
)

var versions = "0.1.0,0.2.0,0.3.0,0.3.1,0.4.0,1.0.0,1.1.0"

func main() {
	if os.Getenv("CNI_COMMAND") != "VERSION" {
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"code": 4, "msg": "fakeplugin: only VERSION"})
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": "1.1.0", "supportedVersions": strings.Split(versions, ",")})
}

// Package bgp will own the embedded GoBGP speaker: global config and peers
// from NodeConfig, the desired-set diff of advertised paths, and session
// state for flockctl and metrics.
package bgp

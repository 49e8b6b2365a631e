// Package layers holds the test that keeps flock's imports pointing down
// (DESIGN.md, "Layout"): cmd → agent → (k8s, bgp, cni, dataplane, ipam) →
// advert, with k8s and bgp not importing each other. It has no code of
// its own; `go test ./internal/layers` lists the module's packages with
// `go list -json` and names every import that breaks a rule.
package layers

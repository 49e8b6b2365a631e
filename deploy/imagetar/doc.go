// Package imagetar packs a root filesystem directory into a single-layer
// docker-archive tarball ("docker save" format) that `ctr images import` and
// `docker load` accept, so images can be built without a registry or a
// container engine.
package imagetar

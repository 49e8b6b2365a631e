// Package netsuite is Kubernetes' upstream e2e suite with only its network
// tests linked in ([sig-network], NetworkPolicy among them): the same
// runner, flags and framework as upstream's e2e.test, built from the same
// release as the lab's binaries, in a fraction of the whole suite's build
// time. `go test -c` makes the binary; the lab runs it with --ginkgo.focus.
package netsuite

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"
	imageutils "k8s.io/kubernetes/test/utils/image"

	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/network" // with network/netpol

	// What upstream's e2e.test links to reconfigure the framework.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/ktesting/format"
)

func TestMain(m *testing.M) {
	showVersion := flag.CommandLine.Bool("version", false, "print the Kubernetes version the suite was built from")
	networkImages := flag.CommandLine.Bool("network-images", false, "print the images the network tests run, one \"<role> <image>\" a line")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Get())
		os.Exit(0)
	}
	if *networkImages {
		// What the network tests run (grep test/e2e/network for
		// imageutils): the lab packs exactly these names.
		for _, im := range []struct {
			role string
			id   imageutils.ImageID
		}{{"agnhost", imageutils.Agnhost}, {"busybox", imageutils.BusyBox}, {"dnsutils", imageutils.GlibcDnsTesting},
			{"nginx", imageutils.Nginx}, {"nginx", imageutils.NginxNew}} {
			fmt.Println(im.role, imageutils.GetE2EImage(im.id))
		}
		fmt.Println("pause", imageutils.GetPauseImageName())
		os.Exit(0)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) { e2e.RunE2ETests(t) }

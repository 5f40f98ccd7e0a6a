// Command kube-controller-manager is the upstream kube-controller-manager
// (k8s.io/kubernetes/cmd/kube-controller-manager/app), built from Go modules for the Gateway API
// conformance rig. It adds nothing: conformance.sh chooses the controllers with --controllers.
package main

import (
	"os"
	_ "time/tzdata" // as upstream's main: CronJob time zones need tzdata even without system files

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as upstream
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}

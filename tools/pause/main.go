// Command pause is the pod sandbox process of the rig's real nodes: it holds the pod's
// namespaces open, reaps orphaned children and exits on SIGINT or SIGTERM. No image
// registry is reachable here, so the rig builds this instead of pulling registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	// As PID 1 of the pod's PID namespace (shareProcessNamespace) it must reap zombies.
	children := make(chan os.Signal, 8)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case <-stop:
			return
		case <-children:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}

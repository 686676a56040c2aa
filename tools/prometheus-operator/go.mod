module nodewright.local/rig/prometheus-operator

go 1.26.0

// Not built: scripts/build-rig.sh copies the ServiceMonitor and PodMonitor CRDs out of this
// module's example/prometheus-operator-crd for the chart's tests.
require github.com/prometheus-operator/prometheus-operator v0.85.0

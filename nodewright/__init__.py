"""The ``nodewright`` command line and the local rig it can start.

``nodewright.cli`` is the console entry point; ``nodewright.rig`` starts a real control plane
(etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) and nats-server on
loopback for tests, benchmarks and the sandbox. Services never import this package.
"""

"""The five NodeWright services. Each is independent of the others (import-linter enforces
it) and talks to them only through events on NATS JetStream and state in Kubernetes."""

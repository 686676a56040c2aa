"""Code every NodeWright service shares: the wire contract, the CR models, and the runtime.

This package is the lower layer. It never imports a service (`services.*`) or the CLI
(`nodewright`); import-linter enforces that. Modules are nouns for data (`events`,
`api`, `subjects`) and gerunds for activities (`logging`).
"""

"""The per-node records, one module per owner (docs/design.md "The per-node state lives on
the Node"): :mod:`scheduler`, :mod:`drainer`, :mod:`executor`, :mod:`validator` and
:mod:`status`. Each service imports only its own (import-linter enforces it) and reads the
others through ``shared.progress.NodeFacts``; the keys, decoding and merge patches they all
share are ``shared.nodestate``'s, and so are the recovery requests the CLI writes.
"""

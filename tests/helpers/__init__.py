"""Helpers shared by the integration tests (polling, manifests). Not fixtures."""

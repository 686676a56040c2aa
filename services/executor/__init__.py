"""The executor service. Runs package stages on nodes as pods and reports their outcome."""

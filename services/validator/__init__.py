"""The validator service. Judges stage checks and node health, lifts readiness taints, serves
admission.
"""

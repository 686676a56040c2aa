"""The status service. Folds events and observed state into CR status, node conditions and
Events.
"""

"""The drainer service. Cordons, waits for protected pods, drains through the Eviction API, and
uncordons.
"""

"""The scheduler service. Decides which target nodes start work next, within budgets, and
announces them.
"""

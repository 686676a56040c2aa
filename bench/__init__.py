"""Benchmarks: they print measurements with ratios against a theoretical minimum or a
baseline measured in the same run; they are not tests."""

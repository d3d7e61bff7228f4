"""Baseline strategies run the way their own users run them, behind harness.strategies.base.Strategy."""

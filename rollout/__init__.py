"""Rollout engines: sample G completions per prompt from cached video embeddings.

A leaf package: it imports neither Lightning modules nor ``rewards``.
"""
